//! When each job and runner pod reached each step, recorded as it happens.
//!
//! The fake's job list and the API server's pods carry no sub-second
//! history, so a recorder watches both while a scenario runs: the fake's
//! state on every change it announces, the pods through a watch. Waits,
//! scale-up and cleanup times are computed afterwards from the record
//! ([`crate::stats`]), not sampled by polling, so they are as exact as the
//! notifications.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use fake_actions::{Control, JobPhase};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What was recorded.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// When each job was enqueued.
    pub enqueued: HashMap<u64, Instant>,
    /// When each job was first seen running.
    pub started: HashMap<u64, Instant>,
    /// When each job was first seen finished.
    pub finished: HashMap<u64, Instant>,
    /// When each pod (by uid: a renewed runner's next pod has the name of
    /// the one before) was first seen.
    pub pod_created: HashMap<String, Instant>,
    /// When each pod was seen deleted from the API server.
    pub pod_gone: HashMap<String, Instant>,
    /// The number of pods after each change, in time order.
    pub live_pods: Vec<(Instant, usize)>,
}

impl Timeline {
    fn record_jobs(&mut self, jobs: &[fake_actions::JobSnapshot], now: Instant) {
        for job in jobs {
            match job.phase {
                JobPhase::Running => {
                    self.started.entry(job.id).or_insert(now);
                }
                JobPhase::Finished => {
                    // A job whose run fell between two notifications
                    // started no later than it finished.
                    self.started.entry(job.id).or_insert(now);
                    self.finished.entry(job.id).or_insert(now);
                }
                _ => {}
            }
        }
    }

    fn record_pod(&mut self, uid: String, exists: bool, now: Instant) {
        if exists {
            self.pod_created.entry(uid).or_insert(now);
        } else if self.pod_created.contains_key(&uid) {
            self.pod_gone.entry(uid).or_insert(now);
        }
        let live = self.pod_created.len() - self.pod_gone.len();
        if self.live_pods.last().map(|(_, n)| *n) != Some(live) {
            self.live_pods.push((now, live));
        }
    }

    /// Job finished to the pod that ran it gone, per job, given which pod
    /// (by uid) ran which jobs.
    pub fn cleanups(&self, pod_jobs: &[(String, Vec<u64>)]) -> Vec<Duration> {
        pod_jobs
            .iter()
            .flat_map(|(pod, jobs)| jobs.iter().map(move |job| (pod, job)))
            .filter_map(|(pod, job)| {
                let gone = self.pod_gone.get(pod)?;
                let finished = self.finished.get(job)?;
                Some(gone.saturating_duration_since(*finished))
            })
            .collect()
    }
}

/// Records a [`Timeline`] until stopped or dropped.
pub struct Recorder {
    timeline: Arc<Mutex<Timeline>>,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Recorder {
    /// Starts watching the fake and the pods of `namespace`.
    pub fn start(control: Control, client: kube::Client, namespace: &str) -> Recorder {
        let timeline = Arc::new(Mutex::new(Timeline::default()));
        let stop = CancellationToken::new();
        let jobs = {
            let timeline = timeline.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                loop {
                    let watch = control.wait_until(Duration::from_secs(3600), |snapshot| {
                        timeline
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .record_jobs(&snapshot.jobs, Instant::now());
                        false
                    });
                    tokio::select! {
                        () = stop.cancelled() => return,
                        _ = watch => {}
                    }
                }
            })
        };
        let pods = {
            let timeline = timeline.clone();
            let stop = stop.clone();
            let api: Api<Pod> = Api::namespaced(client, namespace);
            tokio::spawn(async move {
                let stream = watcher::watcher(api, watcher::Config::default());
                let mut stream = std::pin::pin!(stream.take_until(stop.cancelled_owned()));
                while let Some(event) = stream.next().await {
                    let now = Instant::now();
                    let (pod, exists) = match event {
                        Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                            (pod, true)
                        }
                        Ok(watcher::Event::Delete(pod)) => (pod, false),
                        _ => continue,
                    };
                    if let Some(uid) = pod.metadata.uid {
                        timeline
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .record_pod(uid, exists, now);
                    }
                }
            })
        };
        Recorder {
            timeline,
            stop,
            tasks: vec![jobs, pods],
        }
    }

    /// Notes that `jobs` were enqueued at `at`.
    pub fn enqueued(&self, jobs: &[u64], at: Instant) {
        let mut timeline = self.timeline.lock().unwrap_or_else(PoisonError::into_inner);
        for job in jobs {
            timeline.enqueued.insert(*job, at);
        }
    }

    /// What was recorded so far.
    pub fn timeline(&self) -> Timeline {
        self.timeline
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop.cancel();
        for task in &self.tasks {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_counts_from_first_seen_to_gone_and_history_keeps_changes_only() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut t = Timeline::default();
        t.record_pod("a".into(), true, t0);
        t.record_pod("a".into(), true, t0 + ms(1));
        t.record_pod("b".into(), true, t0 + ms(2));
        t.record_pod("a".into(), false, t0 + ms(3));
        // A deletion of a pod never seen changes nothing.
        t.record_pod("z".into(), false, t0 + ms(4));
        assert_eq!(t.live_pods, [(t0, 1), (t0 + ms(2), 2), (t0 + ms(3), 1)]);
        t.finished.insert(7, t0 + ms(1));
        t.finished.insert(8, t0 + ms(2));
        let cleanups = t.cleanups(&[("a".into(), vec![7]), ("b".into(), vec![8])]);
        assert_eq!(cleanups, [ms(2)], "b is not gone yet");
    }
}
