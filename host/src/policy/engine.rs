//! The process-wide wasmtime engine: configuration, compile cache, epoch
//! ticker and the bound on concurrent calls.

use std::collections::HashMap;
use std::fs;
use std::hash::{Hash, Hasher};
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lru::LruCache;
use sha2::{Digest, Sha256};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::bindings::{HostState, scaling::arcwright::policy::host};
use super::call::MAX_MEMORY_LIMIT;
use super::{PolicyError, PolicyKind, PolicyModule};

/// How the engine is sized. The defaults suit the controller; the CLI and
/// tests use them too, so what is tested is what runs.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// How many policy calls may run at once. It sizes both the semaphore and
    /// the pooling allocator, so the pool can never be exhausted by calls
    /// that went through the semaphore.
    pub max_concurrency: usize,
    /// How often the epoch advances. Deadlines are whole ticks, so a call is
    /// stopped between `deadline` and `deadline + tick` after it started.
    pub epoch_tick: Duration,
    /// The largest module accepted, in bytes. A ConfigMap cannot hold more
    /// than ~1 MiB anyway; the bundled policies are tens of KiB.
    pub max_module_size: usize,
    /// Where compiled modules are kept across restarts (`<sha256>-<engine
    /// hash>.cwasm`), or `None` to cache in memory only.
    pub cache_dir: Option<PathBuf>,
    /// Bytes of linear memory kept resident when a pool slot is reused,
    /// reset with `memset` instead of `madvise`. A policy touches a few
    /// hundred KiB (stack, data, the heap its JSON parsing grows); with those
    /// pages kept, the next call in the slot takes no page faults. Measured
    /// on 2 cores (`benches/policy.rs`): the bundled default's fresh-instance
    /// p50 went from ~25 us (0) and ~20 us (64 KiB) to ~13 us (1 MiB). The
    /// cost is at most this many resident bytes per pooled memory.
    pub memory_keep_resident: usize,
    /// How many compiled modules are kept in memory. ConfigMap updates
    /// produce new digests; without a bound a policy edited every minute
    /// would grow the controller forever. When full, the module used least
    /// recently is dropped, one at a time: the modules the scale sets are
    /// running stay compiled however many versions come and go.
    pub compiled_cache_entries: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        let cpus = std::thread::available_parallelism().map_or(2, usize::from);
        Self {
            max_concurrency: (cpus * 2).max(4),
            epoch_tick: Duration::from_millis(5),
            max_module_size: 4 * 1024 * 1024,
            cache_dir: None,
            memory_keep_resident: 1024 * 1024,
            compiled_cache_entries: 64,
        }
    }
}

/// One wasmtime `Engine` for the process, with what every module shares.
///
/// Cheap to clone. The epoch ticker is a plain thread rather than a tokio
/// task: deadlines must keep advancing when every async worker is busy, and
/// the CLI runs without a runtime. The thread holds only a weak reference
/// and ends when the last clone of the engine is gone.
#[derive(Clone)]
pub struct PolicyEngine {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    linker: Linker<HostState>,
    config: EngineConfig,
    permits: Arc<Semaphore>,
    compiled: Mutex<LruCache<[u8; 32], Component>>,
    /// One gate per digest being compiled. Every object that refers to a
    /// ConfigMap loads its new version when the ConfigMap changes; without
    /// the gate each would compile the same module at once, and a policy
    /// edit would cost a Cranelift compile per scale set instead of one.
    compiling: Mutex<HashMap<[u8; 32], Arc<Mutex<()>>>>,
    /// Modules compiled (or read from the disk cache) since the engine
    /// started: what the memory cache and the gates save shows here.
    compilations: AtomicU64,
    compat_hash: u64,
}

/// Proof that the holder may use a pool slot: calls take one of these, so
/// the pooling allocator is never asked for more instances than it has.
pub(crate) struct CallPermit(#[allow(dead_code)] OwnedSemaphorePermit);

impl PolicyEngine {
    /// Creates the engine and starts its epoch ticker.
    pub fn new(config: EngineConfig) -> Result<Self, PolicyError> {
        if config.max_concurrency == 0 {
            return Err(PolicyError::Engine(
                "max_concurrency must be at least 1".into(),
            ));
        }
        let cache_entries = NonZeroUsize::new(config.compiled_cache_entries).ok_or_else(|| {
            PolicyError::Engine("compiled_cache_entries must be at least 1".into())
        })?;
        let slots = u32::try_from(config.max_concurrency)
            .map_err(|_| PolicyError::Engine("max_concurrency is too large".into()))?;
        let mut pool = PoolingAllocationConfig::new();
        pool.total_component_instances(slots)
            .total_core_instances(slots * 4)
            .total_memories(slots * 2)
            .total_tables(slots * 4)
            .max_core_instances_per_component(4)
            .max_memories_per_component(2)
            .max_tables_per_component(4)
            .max_memory_size(MAX_MEMORY_LIMIT)
            .linear_memory_keep_resident(config.memory_keep_resident)
            .table_keep_resident(config.memory_keep_resident.min(16 * 1024));

        let mut wasm = Config::new();
        wasm.epoch_interruption(true)
            .memory_init_cow(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&wasm).map_err(|e| PolicyError::Engine(format!("{e:#}")))?;

        let mut linker = Linker::new(&engine);
        host::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |state| state)
            .map_err(|e| PolicyError::Engine(format!("{e:#}")))?;

        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let compat_hash = hasher.finish();

        let weak = engine.weak();
        let tick = config.epoch_tick;
        std::thread::Builder::new()
            .name("policy-epoch".into())
            .spawn(move || {
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(tick);
                }
            })
            .map_err(|e| PolicyError::Engine(format!("could not start the epoch ticker: {e}")))?;

        Ok(Self {
            inner: Arc::new(Inner {
                permits: Arc::new(Semaphore::new(config.max_concurrency)),
                engine,
                linker,
                config,
                compiled: Mutex::new(LruCache::new(cache_entries)),
                compiling: Mutex::new(HashMap::new()),
                compilations: AtomicU64::new(0),
                compat_hash,
            }),
        })
    }

    /// The configuration the engine was built with.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    pub(crate) fn wasmtime(&self) -> &Engine {
        &self.inner.engine
    }

    pub(crate) fn linker(&self) -> &Linker<HostState> {
        &self.inner.linker
    }

    /// Waits for a call slot without blocking an async worker.
    pub(crate) async fn permit(&self) -> CallPermit {
        let permit = Arc::clone(&self.inner.permits)
            .acquire_owned()
            .await
            .expect("the call semaphore is never closed");
        CallPermit(permit)
    }

    /// Waits for a call slot on the current thread (CLI, benchmarks, code
    /// already on a blocking thread).
    pub(crate) fn permit_blocking(&self) -> CallPermit {
        futures::executor::block_on(self.permit())
    }

    /// Runs `f` on tokio's blocking pool once a call slot is free, so guest
    /// code never runs on an async worker thread.
    pub(crate) async fn spawn<R, F>(&self, f: F) -> Result<R, PolicyError>
    where
        F: FnOnce(&CallPermit) -> R + Send + 'static,
        R: Send + 'static,
    {
        let permit = self.permit().await;
        tokio::task::spawn_blocking(move || f(&permit))
            .await
            .map_err(|e| PolicyError::Join(e.to_string()))
    }

    /// Loads a module: checks its shape and imports, compiles it (once per
    /// digest), finds its world and pre-instantiates it. `expected` refuses a
    /// policy of another kind.
    pub fn load(
        &self,
        wasm: &[u8],
        expected: Option<PolicyKind>,
    ) -> Result<PolicyModule, PolicyError> {
        let (component, digest) = self.compile(wasm)?;
        PolicyModule::new(
            self.clone(),
            component,
            hex::encode(digest),
            wasm.len(),
            expected,
        )
    }

    /// How many modules this engine has compiled (or read back from its
    /// disk cache), as opposed to found in its memory cache.
    pub fn compilations(&self) -> u64 {
        self.inner.compilations.load(Ordering::Relaxed)
    }

    /// Loads a bundled policy by kind and name.
    pub fn load_builtin(&self, kind: PolicyKind, name: &str) -> Result<PolicyModule, PolicyError> {
        let builtin = super::bundled::find(kind, name)?;
        self.load(builtin.wasm, Some(kind))
    }

    /// Compiles `wasm`, or returns the cached compilation of the same digest.
    fn compile(&self, wasm: &[u8]) -> Result<(Component, [u8; 32]), PolicyError> {
        sniff(wasm)?;
        let limit = self.inner.config.max_module_size;
        if wasm.len() > limit {
            return Err(PolicyError::TooLarge {
                size: wasm.len(),
                limit,
            });
        }
        let digest: [u8; 32] = Sha256::digest(wasm).into();
        if let Some(component) = self.cached(&digest) {
            return Ok((component, digest));
        }
        let gate = {
            let mut gates = self
                .inner
                .compiling
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            Arc::clone(gates.entry(digest).or_default())
        };
        let _turn = gate.lock().unwrap_or_else(|e| e.into_inner());
        // Whoever held the gate before may have compiled it already.
        if let Some(component) = self.cached(&digest) {
            return Ok((component, digest));
        }
        let compiled = self.compile_uncached(wasm, &digest);
        self.inner
            .compiling
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&digest);
        compiled.map(|component| (component, digest))
    }

    /// Compiles a module that is not in the memory cache and caches it.
    fn compile_uncached(&self, wasm: &[u8], digest: &[u8; 32]) -> Result<Component, PolicyError> {
        self.inner.compilations.fetch_add(1, Ordering::Relaxed);
        let component = match &self.inner.config.cache_dir {
            Some(dir) => self.compile_with_disk_cache(wasm, digest, dir)?,
            None => Component::new(&self.inner.engine, wasm)
                .map_err(|e| PolicyError::Compile(format!("{e:#}")))?,
        };
        let mut compiled = self
            .inner
            .compiled
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        compiled.put(*digest, component.clone());
        Ok(component)
    }

    /// The compiled module of `digest`, if kept; finding it makes it the
    /// most recently used.
    fn cached(&self, digest: &[u8; 32]) -> Option<Component> {
        let mut compiled = self
            .inner
            .compiled
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        compiled.get(digest).cloned()
    }

    /// Compiles through the on-disk cache. Only files this engine wrote are
    /// ever deserialised (the name carries the digest of the source and the
    /// engine's compatibility hash), because deserialising is loading native
    /// code. A file that fails to load is recompiled and replaced.
    fn compile_with_disk_cache(
        &self,
        wasm: &[u8],
        digest: &[u8; 32],
        dir: &std::path::Path,
    ) -> Result<Component, PolicyError> {
        let engine = &self.inner.engine;
        let path = dir.join(format!(
            "{}-{:016x}.cwasm",
            hex::encode(digest),
            self.inner.compat_hash
        ));
        // Read into memory rather than `deserialize_file`'s mmap: a cache file
        // truncated or rewritten by anyone while mapped would turn into SIGBUS
        // in the controller.
        if let Ok(bytes) = fs::read(&path) {
            // SAFETY: the file is named after the sha256 of the source and the
            // compatibility hash of this engine, and only `precompile_component`
            // below writes such files; wasmtime also checks the header.
            match unsafe { Component::deserialize(engine, &bytes) } {
                Ok(component) => return Ok(component),
                Err(err) => {
                    tracing::warn!(path = %path.display(), "discarding an unreadable compiled policy: {err:#}")
                }
            }
        }
        let bytes = engine
            .precompile_component(wasm)
            .map_err(|e| PolicyError::Compile(format!("{e:#}")))?;
        // SAFETY: `bytes` was produced just now by this engine.
        let component = unsafe { Component::deserialize(engine, &bytes) }
            .map_err(|e| PolicyError::Compile(format!("{e:#}")))?;
        let written = fs::create_dir_all(dir).and_then(|()| {
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            fs::write(&tmp, &bytes)?;
            fs::rename(&tmp, &path)
        });
        if let Err(err) = written {
            tracing::warn!(dir = %dir.display(), "could not write the compiled policy cache: {err}");
        }
        Ok(component)
    }
}

/// Refuses what is plainly not a component before wasmtime sees it, with a
/// message that says what was given instead.
fn sniff(wasm: &[u8]) -> Result<(), PolicyError> {
    if wasm.len() < 8 || &wasm[..4] != b"\0asm" {
        return Err(PolicyError::NotWebAssembly);
    }
    // Bytes 4..8 are the version and layer: 1,0,0,0 is a core module;
    // components use layer 1.
    if wasm[6..8] == [0, 0] {
        return Err(PolicyError::CoreModule);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniff_tells_core_modules_and_garbage_apart() {
        assert!(matches!(
            sniff(b"not wasm at all"),
            Err(PolicyError::NotWebAssembly)
        ));
        assert!(matches!(sniff(b"\0asm"), Err(PolicyError::NotWebAssembly)));
        assert!(matches!(
            sniff(b"\0asm\x01\0\0\0"),
            Err(PolicyError::CoreModule)
        ));
        assert!(sniff(b"\0asm\x0d\0\x01\0").is_ok());
    }

    #[test]
    fn the_compile_cache_drops_the_least_recently_used_module() {
        let engine = PolicyEngine::new(EngineConfig {
            compiled_cache_entries: 2,
            ..EngineConfig::default()
        })
        .unwrap();
        let load = |name: &str| {
            engine.load_builtin(PolicyKind::Scaling, name).unwrap();
            engine.compilations()
        };
        assert_eq!(load("default"), 1);
        assert_eq!(load("buffered"), 2);
        // Using `default` makes `buffered` the least recently used...
        assert_eq!(load("default"), 2);
        // ...so the third module pushes out `buffered` alone.
        assert_eq!(load("cooldown"), 3);
        assert_eq!(load("default"), 3);
        assert_eq!(load("cooldown"), 3);
        assert_eq!(load("buffered"), 4);
        assert!(matches!(
            PolicyEngine::new(EngineConfig {
                compiled_cache_entries: 0,
                ..EngineConfig::default()
            }),
            Err(PolicyError::Engine(_))
        ));
    }

    #[test]
    fn zero_concurrency_is_refused() {
        let config = EngineConfig {
            max_concurrency: 0,
            ..EngineConfig::default()
        };
        assert!(matches!(
            PolicyEngine::new(config),
            Err(PolicyError::Engine(_))
        ));
    }
}
