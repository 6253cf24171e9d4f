//! The kubelet's half, as pure functions: recognising a runner pod and
//! writing the pod status a kubelet would write.
//!
//! A runner pod is recognised the way the runner image recognises its job:
//! by the `ACTIONS_RUNNER_INPUT_JITCONFIG` environment variable on one of its
//! containers, never by a controller's labels. Any controller's runner pods
//! are therefore played, and a pod that lacks the variable is left alone, as
//! the real runner would fail to start without it.

use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::{Value, json};

/// The variable the runner reads its JIT config from.
pub const JIT_CONFIG_ENV: &str = "ACTIONS_RUNNER_INPUT_JITCONFIG";

/// Where a variable of the runner container comes from.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum EnvSource {
    /// Written into the pod spec.
    Literal(String),
    /// A key of a Secret in the pod's namespace.
    Secret { name: String, key: String },
}

/// Shows where the value comes from, never the literal value (JIT configs
/// and proxy credentials pass through here).
impl std::fmt::Debug for EnvSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnvSource::Literal(_) => f.write_str("Literal(<redacted>)"),
            EnvSource::Secret { name, key } => write!(f, "Secret({name}/{key})"),
        }
    }
}

/// Where `container`'s variable `name` comes from, if it has one the
/// simulator can read (a literal or a Secret's key).
pub(crate) fn env_source(container: &Container, name: &str) -> Option<EnvSource> {
    let env = container.env.as_ref()?.iter().find(|e| e.name == name)?;
    if let Some(value) = &env.value {
        return Some(EnvSource::Literal(value.clone()));
    }
    let secret = env.value_from.as_ref()?.secret_key_ref.as_ref()?;
    Some(EnvSource::Secret {
        name: secret.name.clone(),
        key: secret.key.clone(),
    })
}

/// The runner container (the one with the JIT variable) and where its
/// config comes from, if the pod is a runner pod.
pub(crate) fn runner_container(pod: &Pod) -> Option<(String, EnvSource)> {
    let spec = pod.spec.as_ref()?;
    spec.containers.iter().find_map(|container| {
        let source = env_source(container, JIT_CONFIG_ENV)?;
        Some((container.name.clone(), source))
    })
}

/// The runner container itself.
pub(crate) fn container<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    containers(pod).iter().find(|c| c.name == name)
}

/// How a container ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    /// The process exit code.
    pub code: i32,
    /// The kubelet's reason: `Completed`, `Error` or `OOMKilled`.
    pub reason: &'static str,
}

impl Exit {
    /// A clean exit.
    pub const OK: Exit = Exit {
        code: 0,
        reason: "Completed",
    };

    /// A non-zero exit of the process itself.
    pub const fn error(code: i32) -> Exit {
        Exit {
            code,
            reason: "Error",
        }
    }

    /// Killed by the kernel for exceeding its memory limit.
    pub const OOM_KILLED: Exit = Exit {
        code: 137,
        reason: "OOMKilled",
    };
}

fn containers(pod: &Pod) -> &[Container] {
    pod.spec.as_ref().map_or(&[], |s| s.containers.as_slice())
}

fn init_containers(pod: &Pod) -> &[Container] {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or(&[])
}

fn container_id(pod: &Pod, container: &str) -> String {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    format!("simulated://{uid}/{container}")
}

fn condition(kind: &str, status: bool, now: &str) -> Value {
    json!({
        "type": kind,
        "status": if status { "True" } else { "False" },
        "lastTransitionTime": now,
    })
}

/// The status of one container that started at `started_at` and is running
/// and ready, as a kubelet reports it.
fn running_container(pod: &Pod, container: &Container, started_at: &str) -> Value {
    json!({
        "name": container.name,
        "image": container.image.clone().unwrap_or_default(),
        "imageID": "",
        "containerID": container_id(pod, &container.name),
        "ready": true,
        "started": true,
        "restartCount": 0,
        "state": {"running": {"startedAt": started_at}},
    })
}

/// A native sidecar: an init container that keeps running beside the
/// pod's containers (dind's docker daemon).
fn is_native_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

/// The status of a pod whose containers all started at `now`: phase
/// Running, every container running and ready, init containers completed
/// but native sidecars, which run on beside them as a kubelet reports.
pub(crate) fn running_status(pod: &Pod, node_ip: &str, pod_ip: &str, now: &str) -> Value {
    let statuses: Vec<Value> = containers(pod)
        .iter()
        .map(|c| running_container(pod, c, now))
        .collect();
    let init: Vec<Value> = init_containers(pod)
        .iter()
        .map(|c| {
            if is_native_sidecar(c) {
                running_container(pod, c, now)
            } else {
                terminated_container(pod, c, &Exit::OK, now, now, false)
            }
        })
        .collect();
    json!({
        "status": {
            "phase": "Running",
            "hostIP": node_ip,
            "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}],
            "startTime": now,
            "conditions": [
                condition("PodScheduled", true, now),
                condition("Initialized", true, now),
                condition("ContainersReady", true, now),
                condition("Ready", true, now),
            ],
            "containerStatuses": statuses,
            "initContainerStatuses": init,
        }
    })
}

/// The status of a pod whose init containers (or, when it has none, one
/// called `warm-up`) have run since `since` and have not finished: phase
/// Pending, not Initialized, every container waiting in PodInitializing.
pub(crate) fn initialising_status(pod: &Pod, since: &str) -> Value {
    let names: Vec<String> = match init_containers(pod) {
        [] => vec!["warm-up".to_owned()],
        some => some.iter().map(|c| c.name.clone()).collect(),
    };
    let init: Vec<Value> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let state = if i == 0 {
                json!({"running": {"startedAt": since}})
            } else {
                json!({"waiting": {"reason": "PodInitializing"}})
            };
            json!({
                "name": name, "image": "", "imageID": "", "ready": false,
                "restartCount": 0, "state": state,
            })
        })
        .collect();
    let statuses: Vec<Value> = containers(pod)
        .iter()
        .map(|c| {
            json!({
                "name": c.name, "image": c.image.clone().unwrap_or_default(), "imageID": "",
                "ready": false, "started": false, "restartCount": 0,
                "state": {"waiting": {"reason": "PodInitializing"}},
            })
        })
        .collect();
    json!({
        "status": {
            "phase": "Pending",
            "startTime": since,
            "conditions": [
                condition("PodScheduled", true, since),
                condition("Initialized", false, since),
                condition("ContainersReady", false, since),
                condition("Ready", false, since),
            ],
            "initContainerStatuses": init,
            "containerStatuses": statuses,
        }
    })
}

fn terminated_container(
    pod: &Pod,
    container: &Container,
    exit: &Exit,
    started: &str,
    now: &str,
    ready: bool,
) -> Value {
    json!({
        "name": container.name,
        "image": container.image.clone().unwrap_or_default(),
        "imageID": "",
        "containerID": container_id(pod, &container.name),
        "ready": ready,
        "started": false,
        "restartCount": 0,
        "state": {"terminated": {
            "exitCode": exit.code,
            "reason": exit.reason,
            "startedAt": started,
            "finishedAt": now,
            "containerID": container_id(pod, &container.name),
        }},
    })
}

/// The status after the runner container ended with `exit`.
///
/// Other containers (a docker sidecar, say) keep running, and the pod phase
/// stays Running while they do, exactly as with `restartPolicy: Never` on a
/// real node: a controller must read the runner container's state, not only
/// the phase. With the runner container alone, the phase is Succeeded for
/// exit 0 and Failed otherwise.
pub(crate) fn exited_status(
    pod: &Pod,
    runner: &str,
    exit: &Exit,
    started: &str,
    now: &str,
) -> Value {
    let mut others_running = false;
    let statuses: Vec<Value> = containers(pod)
        .iter()
        .map(|c| {
            if c.name == runner {
                terminated_container(pod, c, exit, started, now, false)
            } else {
                others_running = true;
                running_container(pod, c, started)
            }
        })
        .collect();
    let phase = match (others_running, exit.code) {
        (true, _) => "Running",
        (false, 0) => "Succeeded",
        (false, _) => "Failed",
    };
    json!({
        "status": {
            "phase": phase,
            "conditions": [
                condition("PodScheduled", true, now),
                condition("Initialized", true, now),
                condition("ContainersReady", false, now),
                condition("Ready", false, now),
            ],
            "containerStatuses": statuses,
        }
    })
}

/// The status of a pod whose runner container cannot start because its
/// JIT config Secret is missing, as the kubelet reports it.
pub(crate) fn config_error_status(pod: &Pod, runner: &str, message: &str, now: &str) -> Value {
    let statuses: Vec<Value> = containers(pod)
        .iter()
        .map(|c| {
            let state = if c.name == runner {
                json!({"waiting": {"reason": "CreateContainerConfigError", "message": message}})
            } else {
                json!({"waiting": {"reason": "ContainerCreating"}})
            };
            json!({
                "name": c.name,
                "image": c.image.clone().unwrap_or_default(),
                "imageID": "",
                "ready": false,
                "started": false,
                "restartCount": 0,
                "state": state,
            })
        })
        .collect();
    json!({
        "status": {
            "phase": "Pending",
            "conditions": [condition("PodScheduled", true, now)],
            "containerStatuses": statuses,
        }
    })
}

/// Whether the pod has ended (a restarted simulator leaves such pods be,
/// apart from confirming their deletion).
pub(crate) fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(containers: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "uid": "u-1"},
            "spec": {"containers": containers},
        }))
        .unwrap()
    }

    #[test]
    fn recognises_a_literal_or_secret_jit_config_on_any_container() {
        let literal = pod(json!([
            {"name": "sidecar", "image": "dind"},
            {"name": "runner", "image": "r", "env": [{"name": JIT_CONFIG_ENV, "value": "abc"}]},
        ]));
        let (container, source) = runner_container(&literal).unwrap();
        assert_eq!(container, "runner");
        assert_eq!(source, EnvSource::Literal("abc".into()));
        assert!(!format!("{source:?}").contains("abc"), "no secret in Debug");

        let secret = pod(json!([{"name": "main", "image": "r", "env": [
            {"name": "OTHER", "value": "x"},
            {"name": JIT_CONFIG_ENV, "valueFrom": {"secretKeyRef": {"name": "s", "key": "jitToken"}}},
        ]}]));
        assert_eq!(
            runner_container(&secret).unwrap().1,
            EnvSource::Secret {
                name: "s".into(),
                key: "jitToken".into()
            }
        );

        let plain =
            pod(json!([{"name": "runner", "image": "r", "env": [{"name": "X", "value": "1"}]}]));
        assert!(runner_container(&plain).is_none());
        let from_config_map = pod(json!([{"name": "runner", "image": "r", "env": [
            {"name": JIT_CONFIG_ENV, "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
        ]}]));
        assert!(runner_container(&from_config_map).is_none());
    }

    #[test]
    fn a_lone_runner_container_decides_the_phase() {
        let p = pod(json!([{"name": "runner", "image": "r"}]));
        let ok = exited_status(&p, "runner", &Exit::OK, "t0", "t1");
        assert_eq!(ok["status"]["phase"], "Succeeded");
        let oom = exited_status(&p, "runner", &Exit::OOM_KILLED, "t0", "t1");
        assert_eq!(oom["status"]["phase"], "Failed");
        let state = &oom["status"]["containerStatuses"][0]["state"]["terminated"];
        assert_eq!(state["exitCode"], 137);
        assert_eq!(state["reason"], "OOMKilled");
        assert_eq!(
            exited_status(&p, "runner", &Exit::error(7), "t0", "t1")["status"]["phase"],
            "Failed"
        );
    }

    #[test]
    fn a_sidecar_keeps_the_pod_running_after_the_runner_exits() {
        let p = pod(json!([{"name": "runner", "image": "r"}, {"name": "dind", "image": "d"}]));
        let status = exited_status(&p, "runner", &Exit::error(1), "t0", "t1");
        assert_eq!(status["status"]["phase"], "Running");
        assert_eq!(
            status["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
            1
        );
        assert!(status["status"]["containerStatuses"][1]["state"]["running"].is_object());
    }

    #[test]
    fn running_status_marks_every_container_running_and_ready() {
        let p = pod(json!([{"name": "runner", "image": "r"}]));
        let status = running_status(&p, "10.0.0.1", "10.1.0.1", "t0");
        assert_eq!(status["status"]["phase"], "Running");
        assert_eq!(status["status"]["containerStatuses"][0]["ready"], true);
        assert!(status["status"]["containerStatuses"][0]["state"]["running"].is_object());
    }
}
