//! The service's state and every rule that changes it, with no I/O.
//!
//! All of the fake's behaviour that a test could assert lives here, behind
//! one mutex in the server: each protocol call is a single method call on
//! [`State`], so the ledger is consistent after every call by construction,
//! however many clients race. The HTTP layer only authenticates, waits
//! (long polls) and renders.
//!
//! The job life cycle, as the service runs it for ephemeral runners:
//! enqueued -> `JobAvailable` to the first matching scale set -> acquired by
//! that set's listener -> assigned to the scale set (`JobAssigned`, carrying
//! statistics that now count it), as soon as the set has fewer jobs than the
//! listener's `X-ScaleSetMaxCapacity` -> handed to a runner of the set when
//! one comes online idle -> started (`JobStarted`) when that runner asks for
//! work -> completed (`JobCompleted`) when the runner reports it, at which
//! point the ephemeral runner deregisters itself.
//!
//! `JobAssigned` is sent when the job is assigned to the set, not to a
//! runner, because that is what lets a listener that scales only on
//! `totalAssignedJobs` scale from zero: with no runner yet, nothing else
//! would carry the new figure to its next long poll.
//!
//! The service takes jobs back in two cases, each a `JobCompleted` with
//! `canceled` followed by a new `JobAvailable`, up to [`MAX_REQUEUES`] times
//! per job, after which the job stays cancelled:
//! * no runner of the set takes a job assigned to it within the assignment
//!   timeout (the listener did not scale, or its runners never came online);
//! * a runner vanishes, or its registration is removed, while it holds a job
//!   that has not finished (requeued only under [`VanishedJobPolicy::Requeue`]).
//!
//! Job messages carry the times clients compute durations from:
//! `scaleSetAssignTime` from `JobAssigned` on, `runnerAssignTime` once a
//! runner was handed the job, `finishTime` on `JobCompleted`; each is set
//! no earlier than the one before it, so the durations are never negative.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, SystemTime};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::auth::{random_token, random_uuid};
use crate::endpoint::Endpoint;
use crate::error::ServiceError;
use crate::jit::JitConfig;
use crate::model::{
    Acquisition, Counters, Fault, FaultKind, HISTORY_LIMIT, JobHistory, JobOutcome, JobPhase,
    JobSnapshot, JobSpec, Ledger, MAX_REQUEUES, PostedMessage, RunnerSnapshot, RuntimeSettings,
    ScaleSetSnapshot, SessionConflict, SessionHistory, SessionRecord, VanishedJobPolicy,
};

/// The job and runner counts a listener scales on, as the service reports
/// them on every message and on the session.
///
/// `totalAssignedJobs` counts every job assigned to the scale set and not
/// finished (waiting for a runner, handed to one, or running): that is the
/// figure ARC's formula `min(minRunners + assigned, max)` needs, because a
/// running job still occupies a runner. It never exceeds the listener's
/// `X-ScaleSetMaxCapacity`; jobs acquired beyond it count only as acquired.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Statistics {
    /// Offered to the scale set, not acquired.
    pub total_available_jobs: u64,
    /// Acquired, not yet handed to a runner (held back for capacity, or
    /// assigned to the set and waiting for a runner).
    pub total_acquired_jobs: u64,
    /// Assigned to the scale set and not finished: waiting for a runner,
    /// handed to one, or running.
    pub total_assigned_jobs: u64,
    /// Being run.
    pub total_running_jobs: u64,
    /// Registrations of the scale set.
    pub total_registered_runners: u64,
    /// Registered runners holding a job.
    pub total_busy_runners: u64,
    /// Online registered runners holding no job.
    pub total_idle_runners: u64,
}

/// What the state needs to know about the server it sits in.
#[derive(Debug, Clone)]
pub(crate) struct StateSettings {
    /// The fake's root URL, without a trailing slash.
    pub base_url: String,
    /// What happens to jobs whose runner vanished.
    pub vanished_jobs: VanishedJobPolicy,
    /// At most this many job messages per message-queue message.
    pub max_batch: usize,
    /// Runner groups besides `Default` (id 1).
    pub extra_runner_groups: Vec<String>,
    /// What tests may change while the fake runs.
    pub runtime: RuntimeSettings,
    /// The personal access token the GitHub API accepts; rotated by
    /// [`State::rotate_pat`].
    pub pat: String,
    /// How long a session may go unpolled before a new one for its scale
    /// set replaces it.
    pub session_idle_expiry: Duration,
}

/// A runner group; id 1 is the default group.
#[derive(Debug, Clone)]
struct RunnerGroup {
    id: u64,
    name: String,
}

/// One configuration URL (org, repo or enterprise) that registered with the
/// service; its scale sets and runners live apart from other tenants'.
#[derive(Debug, Clone)]
struct Tenant {
    config_path: String,
    owner: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Label {
    #[serde(rename = "type", default = "system")]
    kind: String,
    name: String,
}

fn system() -> String {
    "System".to_owned()
}

#[derive(Debug)]
struct ScaleSet {
    id: u64,
    tenant: u32,
    name: String,
    group_id: u64,
    labels: Vec<Label>,
    runner_setting: Value,
    created_on: String,
    session: Option<String>,
    /// The `X-ScaleSetMaxCapacity` of the last message poll; `None` is
    /// unbounded (no poll yet, or a client that does not send it).
    max_capacity: Option<u64>,
    /// Job messages not yet batched into a queue message.
    pending: VecDeque<Value>,
    /// Queue messages delivered or deliverable and not deleted, by id.
    messages: BTreeMap<u64, Vec<Value>>,
}

impl ScaleSet {
    /// Whether a job with `labels` may run here: every label of the job is
    /// one of the set's labels or its name.
    fn matches(&self, labels: &[String]) -> bool {
        labels
            .iter()
            .all(|l| *l == self.name || self.labels.iter().any(|s| s.name == *l))
    }
}

#[derive(Debug)]
struct Session {
    id: String,
    scale_set: u64,
    owner: String,
    queue_token: String,
    /// When its listener last asked for a message (or created it).
    last_polled: Timestamp,
}

#[derive(Debug)]
struct Runner {
    id: u64,
    name: String,
    tenant: u32,
    scale_set: u64,
    secret: String,
    online: bool,
    job: Option<u64>,
}

#[derive(Debug)]
struct Job {
    id: u64,
    labels: Vec<String>,
    duration: Duration,
    outcome: JobOutcome,
    repository: Option<String>,
    job_id: String,
    queue_time: String,
    phase: JobPhase,
    scale_set: Option<u64>,
    runner: Option<u64>,
    result: Option<&'static str>,
    requeues: u32,
    /// When it was last assigned to its scale set (`JobAssigned`).
    scale_set_assigned: Option<Timestamp>,
    /// When it was last handed to a runner.
    runner_assigned: Option<Timestamp>,
}

impl Job {
    /// Whether it occupies a place of its scale set's capacity: assigned to
    /// the set and not finished.
    fn holds_capacity(&self) -> bool {
        matches!(
            self.phase,
            JobPhase::Acquired | JobPhase::Assigned | JobPhase::Running
        )
    }

    /// Back to being offered, as if never acquired.
    fn reoffer(&mut self) {
        self.phase = JobPhase::Available;
        self.runner = None;
        self.scale_set_assigned = None;
        self.runner_assigned = None;
    }

    /// The time fields of its messages: `scaleSetAssignTime` and
    /// `runnerAssignTime` once set, and `finishTime` (`finished`, never
    /// before the other two) for `JobCompleted`.
    fn times(&self, finished: Option<Timestamp>) -> Value {
        let mut times = serde_json::Map::new();
        if let Some(t) = self.scale_set_assigned {
            times.insert("scaleSetAssignTime".into(), json!(t.to_string()));
        }
        if let Some(t) = self.runner_assigned {
            times.insert("runnerAssignTime".into(), json!(t.to_string()));
        }
        if let Some(t) = finished {
            let earliest = self.runner_assigned.or(self.scale_set_assigned);
            let t = earliest.map_or(t, |e| e.max(t));
            times.insert("finishTime".into(), json!(t.to_string()));
        }
        Value::Object(times)
    }
}

/// Why the service cancelled a job it had assigned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cancellation {
    /// Its runner vanished or was removed before finishing it.
    RunnerVanished,
    /// No runner of its scale set took it within the assignment timeout.
    Unclaimed,
}

/// How many of `held` jobs a scale set with `in_set` jobs assigned may take
/// now, given its listener's last `X-ScaleSetMaxCapacity`.
///
/// A capacity lowered below what the set already has assigns nothing and
/// takes nothing back: the service does not unassign jobs, it only stops
/// adding to them.
fn assignable(capacity: Option<u64>, in_set: u64, held: u64) -> u64 {
    match capacity {
        None => held,
        Some(capacity) => held.min(capacity.saturating_sub(in_set)),
    }
}

/// Whether a job cancelled for `why`, already requeued `requeues` times, is
/// offered again (rather than left cancelled).
fn requeued(why: Cancellation, policy: VanishedJobPolicy, requeues: u32) -> bool {
    let allowed = match why {
        Cancellation::RunnerVanished => policy == VanishedJobPolicy::Requeue,
        Cancellation::Unclaimed => true,
    };
    allowed && requeues < MAX_REQUEUES
}

/// What [`State::expire_unclaimed`] did, and when it needs to run again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Expiry {
    /// Jobs cancelled now.
    pub cancelled: usize,
    /// When the next job assigned to a set and still waiting times out.
    pub next_deadline: Option<Timestamp>,
}

/// A job handed to the runner that starts it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunnerJob {
    /// The job's `runnerRequestId`.
    pub runner_request_id: u64,
    /// The job's display name.
    pub display_name: String,
    /// How long to work on it.
    pub duration_ms: u64,
    /// How it will end.
    pub outcome: JobOutcome,
}

/// What `DELETE agents/{id}` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Removal {
    Removed,
    AlreadyGone,
}

/// The whole service.
pub(crate) struct State {
    settings: StateSettings,
    next_id: u64,
    tenants: Vec<Tenant>,
    registration_tokens: HashMap<String, (String, i64)>,
    installation_tokens: HashMap<String, i64>,
    pub(crate) admin_generation: u64,
    groups: Vec<RunnerGroup>,
    scale_sets: BTreeMap<u64, ScaleSet>,
    sessions: HashMap<String, Session>,
    expired_sessions: HashSet<String>,
    /// Queue token -> session id; expired tokens stay, marked, to answer
    /// "expired" rather than "invalid".
    queue_tokens: HashMap<String, (String, bool)>,
    runners: BTreeMap<u64, Runner>,
    jobs: BTreeMap<u64, Job>,
    ledger: Ledger,
    counters: Counters,
    faults: Vec<Fault>,
    history: SessionHistory,
    /// Every job message posted, for [`State::job_history`].
    posted: VecDeque<PostedMessage>,
    /// Posted messages left out of `posted` past [`HISTORY_LIMIT`].
    posted_dropped: u64,
}

fn now_rfc3339() -> String {
    Timestamp::now().to_string()
}

fn now_secs() -> i64 {
    Timestamp::now().as_second()
}

impl State {
    pub(crate) fn new(settings: StateSettings) -> State {
        let mut groups = vec![RunnerGroup {
            id: 1,
            name: "Default".to_owned(),
        }];
        for (i, name) in settings.extra_runner_groups.iter().enumerate() {
            groups.push(RunnerGroup {
                id: i as u64 + 2,
                name: name.clone(),
            });
        }
        State {
            settings,
            // Ids start high enough that a test cannot pass by confusing
            // a runner id with a scale set id or a count.
            next_id: 1000,
            tenants: Vec::new(),
            registration_tokens: HashMap::new(),
            installation_tokens: HashMap::new(),
            admin_generation: 0,
            groups,
            scale_sets: BTreeMap::new(),
            sessions: HashMap::new(),
            expired_sessions: HashSet::new(),
            queue_tokens: HashMap::new(),
            runners: BTreeMap::new(),
            jobs: BTreeMap::new(),
            ledger: Ledger::default(),
            counters: Counters::default(),
            faults: Vec::new(),
            history: SessionHistory::default(),
            posted: VecDeque::new(),
            posted_dropped: 0,
        }
    }

    /// One id sequence for everything (runners, scale sets, jobs, messages):
    /// ids only grow, which gives message ids their required monotonicity.
    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub(crate) fn base_url(&self) -> &str {
        &self.settings.base_url
    }

    // ----- counters and faults -------------------------------------------

    /// Counts a call and returns the fault it meets, if one is armed.
    pub(crate) fn enter(&mut self, endpoint: Endpoint) -> Option<FaultKind> {
        let count = self.counters.0.entry(endpoint).or_default();
        count.calls += 1;
        let index = self
            .faults
            .iter()
            .position(|f| f.endpoint == endpoint && f.times > 0)?;
        let fault = &mut self.faults[index];
        fault.times -= 1;
        let kind = fault.kind.clone();
        if fault.times == 0 {
            self.faults.remove(index);
        }
        count.faults += 1;
        Some(kind)
    }

    pub(crate) fn inject(&mut self, fault: Fault) {
        if fault.times > 0 {
            self.faults.push(fault);
        }
    }

    pub(crate) fn clear_faults(&mut self) {
        self.faults.clear();
    }

    pub(crate) fn counters(&self) -> Counters {
        self.counters.clone()
    }

    pub(crate) fn ledger(&self) -> Ledger {
        let mut ledger = self.ledger.clone();
        ledger.still_registered = self.runners.len() as u64;
        ledger.jobs_unfinished = self
            .jobs
            .values()
            .filter(|j| j.phase != JobPhase::Finished)
            .count() as u64;
        ledger
    }

    // ----- GitHub API side -------------------------------------------------

    pub(crate) fn issue_installation_token(&mut self, lifetime_secs: i64) -> (String, i64) {
        let token = random_token("ghs_");
        let expires = now_secs() + lifetime_secs;
        self.installation_tokens.insert(token.clone(), expires);
        (token, expires)
    }

    /// Whether `token` is a live installation token (a PAT is checked by the caller).
    pub(crate) fn check_installation_token(&self, token: &str) -> Result<(), ServiceError> {
        match self.installation_tokens.get(token) {
            Some(expires) if *expires > now_secs() => Ok(()),
            Some(_) => Err(ServiceError::TokenExpired),
            None => Err(ServiceError::InvalidCredentials),
        }
    }

    /// A registration token for the configuration path (`/org`,
    /// `/owner/repo` or `/enterprises/ent`).
    pub(crate) fn issue_registration_token(
        &mut self,
        config_path: String,
        lifetime_secs: i64,
    ) -> (String, i64) {
        let token = random_token("AAR");
        let expires = now_secs() + lifetime_secs;
        self.registration_tokens
            .insert(token.clone(), (config_path, expires));
        (token, expires)
    }

    /// Redeems a registration token for the given configuration URL and
    /// returns the tenant number, creating the tenant on first use.
    pub(crate) fn register(&mut self, token: &str, config_url: &str) -> Result<u32, ServiceError> {
        let (scope, expires) = self
            .registration_tokens
            .get(token)
            .ok_or(ServiceError::InvalidCredentials)?
            .clone();
        if expires <= now_secs() {
            return Err(ServiceError::TokenExpired);
        }
        // Only the path matters: a client may spell the host differently
        // (`localhost` for `127.0.0.1`) and still mean this service.
        let path = config_url
            .split_once("://")
            .map(|(_, rest)| rest.find('/').map_or("", |i| &rest[i..]))
            .ok_or_else(|| ServiceError::BadRequest(format!("{config_url:?} is not a URL")))?
            .trim_end_matches('/');
        if path != scope {
            return Err(ServiceError::InvalidCredentials);
        }
        if let Some(i) = self.tenants.iter().position(|t| t.config_path == path) {
            return Ok(i as u32 + 1);
        }
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let owner = match segments.as_slice() {
            ["enterprises", ent] => (*ent).to_owned(),
            [owner, ..] => (*owner).to_owned(),
            [] => return Err(ServiceError::BadRequest("empty configuration URL".into())),
        };
        self.tenants.push(Tenant {
            config_path: path.to_owned(),
            owner,
        });
        Ok(self.tenants.len() as u32)
    }

    /// Whether `token` is the PAT the GitHub API accepts now.
    pub(crate) fn is_pat(&self, token: &str) -> bool {
        token == self.settings.pat
    }

    /// The PAT the GitHub API accepts now.
    pub(crate) fn pat(&self) -> &str {
        &self.settings.pat
    }

    /// Accepts `pat` from now on and revokes the old one, as a rotation
    /// that revokes the old token does: the old PAT is refused, and the
    /// tokens issued so far (installation, registration, admin) expire, so
    /// a client still holding the old PAT cannot get new ones.
    pub(crate) fn rotate_pat(&mut self, pat: String) {
        self.settings.pat = pat;
        self.expire_github_tokens();
        self.admin_generation += 1;
    }

    pub(crate) fn set_base_url(&mut self, url: String) {
        self.settings.base_url = url;
    }

    pub(crate) fn expire_github_tokens(&mut self) {
        for expires in self.installation_tokens.values_mut() {
            *expires = 0;
        }
        for (_, expires) in self.registration_tokens.values_mut() {
            *expires = 0;
        }
    }

    // ----- runner groups and scale sets ------------------------------------

    pub(crate) fn runner_groups_by_name(&self, name: &str) -> Value {
        let value: Vec<Value> = self
            .groups
            .iter()
            .filter(|g| g.name == name)
            .map(|g| json!({"id": g.id, "name": g.name, "size": 0, "isDefaultGroup": g.id == 1}))
            .collect();
        json!({"count": value.len(), "value": value})
    }

    fn group_name(&self, id: u64) -> Option<&str> {
        self.groups
            .iter()
            .find(|g| g.id == id)
            .map(|g| g.name.as_str())
    }

    fn scale_set(&self, tenant: u32, id: u64) -> Result<&ScaleSet, ServiceError> {
        self.scale_sets
            .get(&id)
            .filter(|s| s.tenant == tenant)
            .ok_or(ServiceError::ScaleSetNotFound { id })
    }

    pub(crate) fn statistics(&self, scale_set: u64) -> Statistics {
        let mut stats = Statistics::default();
        for job in self
            .jobs
            .values()
            .filter(|j| j.scale_set == Some(scale_set))
        {
            match job.phase {
                JobPhase::Available => stats.total_available_jobs += 1,
                JobPhase::Held => stats.total_acquired_jobs += 1,
                JobPhase::Acquired => {
                    stats.total_acquired_jobs += 1;
                    stats.total_assigned_jobs += 1;
                }
                JobPhase::Assigned => stats.total_assigned_jobs += 1,
                JobPhase::Running => {
                    stats.total_assigned_jobs += 1;
                    stats.total_running_jobs += 1;
                }
                JobPhase::Queued | JobPhase::Finished => {}
            }
        }
        for runner in self.runners.values().filter(|r| r.scale_set == scale_set) {
            stats.total_registered_runners += 1;
            if runner.job.is_some() {
                stats.total_busy_runners += 1;
            } else if runner.online {
                stats.total_idle_runners += 1;
            }
        }
        stats
    }

    fn scale_set_json(&self, set: &ScaleSet) -> Value {
        json!({
            "id": set.id,
            "name": set.name,
            "runnerGroupId": set.group_id,
            "runnerGroupName": self.group_name(set.group_id).unwrap_or_default(),
            "labels": set.labels,
            "RunnerSetting": set.runner_setting,
            "createdOn": set.created_on,
            "runnerJitConfigUrl": format!(
                "{}/tenant/{}/_apis/runtime/runnerscalesets/{}/generatejitconfig",
                self.settings.base_url, set.tenant, set.id
            ),
            "statistics": self.statistics(set.id),
        })
    }

    pub(crate) fn get_scale_set(&self, tenant: u32, id: u64) -> Result<Value, ServiceError> {
        Ok(self.scale_set_json(self.scale_set(tenant, id)?))
    }

    pub(crate) fn scale_sets_by_name(&self, tenant: u32, group: Option<u64>, name: &str) -> Value {
        let value: Vec<Value> = self
            .scale_sets
            .values()
            .filter(|s| s.tenant == tenant && s.name == name)
            .filter(|s| group.is_none_or(|g| s.group_id == g))
            .map(|s| self.scale_set_json(s))
            .collect();
        json!({"count": value.len(), "value": value})
    }

    pub(crate) fn create_scale_set(
        &mut self,
        tenant: u32,
        request: ScaleSetRequest,
    ) -> Result<Value, ServiceError> {
        let name = request
            .name
            .filter(|n| !n.is_empty())
            .ok_or_else(|| ServiceError::BadRequest("a scale set needs a name".into()))?;
        let group_id = request.runner_group_id.unwrap_or(1);
        if self.group_name(group_id).is_none() {
            return Err(ServiceError::BadRequest(format!(
                "runner group {group_id} does not exist"
            )));
        }
        if self
            .scale_sets
            .values()
            .any(|s| s.tenant == tenant && s.group_id == group_id && s.name == name)
        {
            return Err(ServiceError::ScaleSetExists {
                name,
                group: group_id,
            });
        }
        let id = self.id();
        let set = ScaleSet {
            id,
            tenant,
            name,
            group_id,
            labels: request.labels.unwrap_or_default(),
            runner_setting: request.runner_setting.unwrap_or_else(|| json!({})),
            created_on: now_rfc3339(),
            session: None,
            max_capacity: None,
            pending: VecDeque::new(),
            messages: BTreeMap::new(),
        };
        self.scale_sets.insert(id, set);
        self.route_queued_jobs();
        Ok(self.scale_set_json(&self.scale_sets[&id]))
    }

    pub(crate) fn update_scale_set(
        &mut self,
        tenant: u32,
        id: u64,
        request: ScaleSetRequest,
    ) -> Result<Value, ServiceError> {
        self.scale_set(tenant, id)?;
        if let Some(group) = request.runner_group_id
            && self.group_name(group).is_none()
        {
            return Err(ServiceError::BadRequest(format!(
                "runner group {group} does not exist"
            )));
        }
        let set = self
            .scale_sets
            .get_mut(&id)
            .ok_or(ServiceError::ScaleSetNotFound { id })?;
        if let Some(name) = request.name.filter(|n| !n.is_empty()) {
            set.name = name;
        }
        if let Some(group) = request.runner_group_id {
            set.group_id = group;
        }
        if let Some(labels) = request.labels {
            set.labels = labels;
        }
        if let Some(setting) = request.runner_setting {
            set.runner_setting = setting;
        }
        self.route_queued_jobs();
        Ok(self.scale_set_json(&self.scale_sets[&id]))
    }

    /// Deletes a scale set: refused while its runners hold jobs; otherwise
    /// its session ends, its remaining registrations go with it, and its
    /// unfinished jobs wait for another matching set.
    pub(crate) fn delete_scale_set(&mut self, tenant: u32, id: u64) -> Result<(), ServiceError> {
        self.scale_set(tenant, id)?;
        if self
            .runners
            .values()
            .any(|r| r.scale_set == id && r.job.is_some())
        {
            return Err(ServiceError::ScaleSetHasAssignedJobs { id });
        }
        let set = self
            .scale_sets
            .remove(&id)
            .ok_or(ServiceError::ScaleSetNotFound { id })?;
        if let Some(session) = set.session {
            self.end_session(&session, false);
        }
        let gone: Vec<u64> = self
            .runners
            .values()
            .filter(|r| r.scale_set == id)
            .map(|r| r.id)
            .collect();
        for runner in gone {
            self.runners.remove(&runner);
            self.ledger.runners_removed += 1;
            self.ledger.removed_with_scale_set += 1;
        }
        for job in self.jobs.values_mut() {
            if job.scale_set == Some(id) && job.phase != JobPhase::Finished {
                job.reoffer();
                job.phase = JobPhase::Queued;
                job.scale_set = None;
            }
        }
        self.route_queued_jobs();
        Ok(())
    }

    // ----- runners -----------------------------------------------------------

    pub(crate) fn generate_jit_config(
        &mut self,
        tenant: u32,
        scale_set: u64,
        name: &str,
    ) -> Result<Value, ServiceError> {
        self.scale_set(tenant, scale_set)?;
        if name.is_empty() {
            return Err(ServiceError::BadRequest("a runner needs a name".into()));
        }
        if self
            .runners
            .values()
            .any(|r| r.tenant == tenant && r.name == name)
        {
            self.ledger.duplicate_runner_names += 1;
            return Err(ServiceError::AgentExists {
                name: name.to_owned(),
            });
        }
        let id = self.id();
        let secret = random_token("");
        let config = JitConfig {
            runner_id: id,
            runner_name: name.to_owned(),
            scale_set_id: scale_set,
            service_url: self.settings.base_url.clone(),
            secret: secret.clone(),
        };
        self.runners.insert(
            id,
            Runner {
                id,
                name: name.to_owned(),
                tenant,
                scale_set,
                secret,
                online: false,
                job: None,
            },
        );
        self.ledger.runners_created += 1;
        Ok(json!({
            "runner": self.runner_json(&self.runners[&id]),
            "encodedJITConfig": config.encode(),
        }))
    }

    fn runner_json(&self, runner: &Runner) -> Value {
        json!({
            "id": runner.id,
            "name": runner.name,
            "runnerScaleSetId": runner.scale_set,
            "status": if runner.online { "online" } else { "offline" },
            "busy": runner.job.is_some(),
        })
    }

    pub(crate) fn get_runner(&self, tenant: u32, id: u64) -> Result<Value, ServiceError> {
        self.runners
            .get(&id)
            .filter(|r| r.tenant == tenant)
            .map(|r| self.runner_json(r))
            .ok_or(ServiceError::AgentNotFound { id })
    }

    pub(crate) fn runners_by_name(&self, tenant: u32, name: &str) -> Value {
        let value: Vec<Value> = self
            .runners
            .values()
            .filter(|r| r.tenant == tenant && r.name == name)
            .map(|r| self.runner_json(r))
            .collect();
        json!({"count": value.len(), "value": value})
    }

    /// `DELETE agents/{id}`.
    pub(crate) fn remove_runner(&mut self, tenant: u32, id: u64) -> Result<Removal, ServiceError> {
        let Some(runner) = self.runners.get(&id).filter(|r| r.tenant == tenant) else {
            self.ledger.remove_calls_for_absent_runners += 1;
            return Ok(Removal::AlreadyGone);
        };
        if let Some(job) = runner.job
            && self.jobs.get(&job).map(|j| j.phase) == Some(JobPhase::Running)
        {
            self.ledger.remove_calls_refused_job_running += 1;
            return Err(ServiceError::JobStillRunning { id, job });
        }
        // Offline first: cancelling its job frees a place in the scale set,
        // and the job assigned to that place must not go to this runner.
        if let Some(runner) = self.runners.get_mut(&id) {
            runner.online = false;
        }
        self.drop_job_of(id);
        self.runners.remove(&id);
        self.ledger.runners_removed += 1;
        self.ledger.removed_by_api += 1;
        Ok(Removal::Removed)
    }

    /// The runner a JIT config names, if the config's secret is right.
    fn runner_for(&self, config: &JitConfig) -> Result<u64, ServiceError> {
        match self.runners.get(&config.runner_id) {
            Some(r) if r.secret == config.secret => Ok(r.id),
            Some(_) => Err(ServiceError::InvalidCredentials),
            None => Err(ServiceError::AgentNotFound {
                id: config.runner_id,
            }),
        }
    }

    /// A runner presents its JIT config: it is online and, if its scale set
    /// has acquired work waiting, gets a job assigned.
    pub(crate) fn connect(&mut self, config: &JitConfig) -> Result<Value, ServiceError> {
        let id = self.runner_for(config)?;
        let runner = self
            .runners
            .get_mut(&id)
            .ok_or(ServiceError::AgentNotFound { id })?;
        runner.online = true;
        let scale_set = runner.scale_set;
        let answer = json!({"runnerId": id, "runnerName": runner.name, "scaleSetId": scale_set});
        self.dispatch(scale_set);
        Ok(answer)
    }

    /// A runner asks for its job: an assigned job starts (`JobStarted`) and is
    /// returned; a job already started is returned again (the runner's
    /// request may have been retried). `None` means nothing is assigned yet.
    pub(crate) fn take_job(
        &mut self,
        config: &JitConfig,
    ) -> Result<Option<RunnerJob>, ServiceError> {
        let id = self.runner_for(config)?;
        let runner = &self.runners[&id];
        if !runner.online {
            return Err(ServiceError::BadRequest(format!(
                "runner {id} has not connected"
            )));
        }
        let Some(job_id) = runner.job else {
            return Ok(None);
        };
        let runner_name = runner.name.clone();
        let job = self
            .jobs
            .get_mut(&job_id)
            .ok_or_else(|| ServiceError::BadRequest(format!("job {job_id} is gone")))?;
        let handed = RunnerJob {
            runner_request_id: job.id,
            display_name: display_name(job.id),
            duration_ms: u64::try_from(job.duration.as_millis()).unwrap_or(u64::MAX),
            outcome: job.outcome,
        };
        if job.phase == JobPhase::Assigned {
            job.phase = JobPhase::Running;
            let scale_set = job.scale_set;
            let mut extra = job.times(None);
            extra["runnerId"] = json!(id);
            extra["runnerName"] = json!(runner_name);
            let item = self.job_message(job_id, "JobStarted", extra);
            if let Some(set) = scale_set {
                self.post(set, item);
            }
        }
        Ok(Some(handed))
    }

    /// A runner reports its job done: `JobCompleted` with the job's result,
    /// and the ephemeral runner's registration is removed.
    pub(crate) fn complete(&mut self, config: &JitConfig) -> Result<Value, ServiceError> {
        let id = self.runner_for(config)?;
        let runner = &self.runners[&id];
        let job_id = runner
            .job
            .filter(|j| self.jobs.get(j).map(|j| j.phase) == Some(JobPhase::Running))
            .ok_or_else(|| ServiceError::BadRequest(format!("runner {id} is not running a job")))?;
        let runner_name = runner.name.clone();
        let (result, scale_set, mut extra) = {
            let job = self
                .jobs
                .get_mut(&job_id)
                .ok_or_else(|| ServiceError::BadRequest(format!("job {job_id} is gone")))?;
            let result = job.outcome.result();
            job.phase = JobPhase::Finished;
            job.result = Some(result);
            (
                job.outcome,
                job.scale_set,
                job.times(Some(Timestamp::now())),
            )
        };
        match result {
            JobOutcome::Succeeded => self.ledger.jobs_succeeded += 1,
            JobOutcome::Failed => self.ledger.jobs_failed += 1,
            JobOutcome::Cancelled => self.ledger.jobs_cancelled += 1,
        }
        extra["result"] = json!(result.result());
        extra["runnerId"] = json!(id);
        extra["runnerName"] = json!(runner_name);
        let item = self.job_message(job_id, "JobCompleted", extra);
        self.runners.remove(&id);
        self.ledger.runners_removed += 1;
        self.ledger.self_deregistered += 1;
        if let Some(set) = scale_set {
            self.post(set, item);
            // Its place in the set's capacity is free for a held job.
            self.dispatch(set);
        }
        Ok(json!({"result": result.result()}))
    }

    /// The runner's pod went away: it is offline, and the job it held, if
    /// any, is cancelled (and requeued per policy). Its registration stays,
    /// as it does in the real service until someone removes it.
    pub(crate) fn vanish(&mut self, config: &JitConfig) -> Result<(), ServiceError> {
        let id = self.runner_for(config)?;
        if let Some(runner) = self.runners.get_mut(&id) {
            runner.online = false;
        }
        self.drop_job_of(id);
        Ok(())
    }

    /// Takes the job a runner holds away from it, cancelling it.
    fn drop_job_of(&mut self, runner_id: u64) {
        let Some(runner) = self.runners.get_mut(&runner_id) else {
            return;
        };
        let Some(job_id) = runner.job.take() else {
            return;
        };
        let runner_name = runner.name.clone();
        if self
            .jobs
            .get(&job_id)
            .is_none_or(|j| j.phase == JobPhase::Finished)
        {
            return;
        }
        self.cancel(
            job_id,
            Cancellation::RunnerVanished,
            Some((runner_id, runner_name)),
        );
    }

    /// The service takes back a job it assigned: `JobCompleted` with
    /// `canceled` (naming the runner that held it, if one did), then either a
    /// new `JobAvailable` or, past [`MAX_REQUEUES`] or under
    /// [`VanishedJobPolicy::Cancel`], the end of the job.
    fn cancel(&mut self, job_id: u64, why: Cancellation, runner: Option<(u64, String)>) {
        let policy = self.settings.vanished_jobs;
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return;
        };
        let mut extra = job.times(Some(Timestamp::now()));
        extra["result"] = json!("canceled");
        if let Some((id, name)) = runner {
            extra["runnerId"] = json!(id);
            extra["runnerName"] = json!(name);
        }
        let requeue = requeued(why, policy, job.requeues);
        let scale_set = job.scale_set;
        if requeue {
            job.requeues += 1;
            job.reoffer();
        } else {
            job.runner = None;
            job.phase = JobPhase::Finished;
            job.result = Some("canceled");
        }
        match why {
            Cancellation::RunnerVanished => self.ledger.jobs_cancelled_runner_vanished += 1,
            Cancellation::Unclaimed => self.ledger.jobs_cancelled_unclaimed += 1,
        }
        if requeue {
            self.ledger.jobs_requeued += 1;
        } else {
            self.ledger.jobs_cancelled += 1;
        }
        let completed = self.job_message(job_id, "JobCompleted", extra);
        if let Some(set) = scale_set {
            self.post(set, completed);
            if requeue {
                let available = self.available_message(job_id);
                self.post(set, available);
            }
            self.dispatch(set);
        }
    }

    /// Cancels every job assigned to a scale set that no runner has taken
    /// within the assignment timeout of `now`, and says when the next one
    /// will time out.
    ///
    /// `now` is an argument, not read here, so the rule can be tested
    /// without waiting; the server calls this from a task that sleeps until
    /// the deadline it returns, or until the state changes.
    pub(crate) fn expire_unclaimed(&mut self, now: Timestamp) -> Expiry {
        let timeout = self.settings.runtime.assignment_timeout;
        let deadline = |job: &Job| {
            job.scale_set_assigned
                .and_then(|t| t.checked_add(timeout).ok())
                .unwrap_or(Timestamp::MAX)
        };
        let overdue: Vec<u64> = self
            .jobs
            .values()
            .filter(|j| j.phase == JobPhase::Acquired && deadline(j) <= now)
            .map(|j| j.id)
            .collect();
        let mut cancelled = 0;
        for job_id in overdue {
            // Checked again: each cancellation dispatches its scale set,
            // which may have moved other jobs on.
            if self
                .jobs
                .get(&job_id)
                .is_some_and(|j| j.phase == JobPhase::Acquired && deadline(j) <= now)
            {
                self.cancel(job_id, Cancellation::Unclaimed, None);
                cancelled += 1;
            }
        }
        Expiry {
            cancelled,
            next_deadline: self
                .jobs
                .values()
                .filter(|j| j.phase == JobPhase::Acquired)
                .map(deadline)
                .min(),
        }
    }

    pub(crate) fn runtime_settings(&self) -> RuntimeSettings {
        self.settings.runtime
    }

    pub(crate) fn set_runtime_settings(&mut self, settings: RuntimeSettings) {
        self.settings.runtime = settings;
    }

    /// Records the `X-ScaleSetMaxCapacity` a listener polled with (`None`
    /// when it sent none) and assigns held jobs it now has room for. Returns
    /// whether anything changed.
    pub(crate) fn set_max_capacity(&mut self, scale_set: u64, capacity: Option<u64>) -> bool {
        let Some(set) = self.scale_sets.get_mut(&scale_set) else {
            return false;
        };
        if set.max_capacity == capacity {
            return false;
        }
        set.max_capacity = capacity;
        self.dispatch(scale_set);
        true
    }

    // ----- jobs -----------------------------------------------------------

    pub(crate) fn enqueue(&mut self, spec: &JobSpec) -> Vec<u64> {
        let mut ids = Vec::with_capacity(spec.count as usize);
        for _ in 0..spec.count {
            let id = self.id();
            self.jobs.insert(
                id,
                Job {
                    id,
                    labels: spec.labels.clone(),
                    duration: spec.duration,
                    outcome: spec.outcome,
                    repository: spec.repository.clone(),
                    job_id: random_uuid(),
                    queue_time: now_rfc3339(),
                    phase: JobPhase::Queued,
                    scale_set: None,
                    runner: None,
                    result: None,
                    requeues: 0,
                    scale_set_assigned: None,
                    runner_assigned: None,
                },
            );
            self.ledger.jobs_enqueued += 1;
            ids.push(id);
        }
        self.route_queued_jobs();
        ids
    }

    /// Offers every queued job to the first scale set that matches it.
    fn route_queued_jobs(&mut self) {
        let queued: Vec<u64> = self
            .jobs
            .values()
            .filter(|j| j.phase == JobPhase::Queued)
            .map(|j| j.id)
            .collect();
        for job_id in queued {
            let labels = &self.jobs[&job_id].labels;
            let Some(set) = self
                .scale_sets
                .values()
                .find(|s| s.matches(labels))
                .map(|s| s.id)
            else {
                continue;
            };
            if let Some(job) = self.jobs.get_mut(&job_id) {
                job.phase = JobPhase::Available;
                job.scale_set = Some(set);
            }
            let item = self.available_message(job_id);
            self.post(set, item);
        }
    }

    /// `acquirejobs`: the listener takes the available jobs it names; the
    /// answer lists those it got (others may be gone or taken). Acquired
    /// jobs are assigned to the set as far as its capacity allows.
    pub(crate) fn acquire(&mut self, scale_set: u64, ids: &[u64]) -> Vec<u64> {
        let mut acquired = Vec::new();
        for id in ids {
            if let Some(job) = self.jobs.get_mut(id)
                && job.scale_set == Some(scale_set)
                && job.phase == JobPhase::Available
            {
                job.phase = JobPhase::Held;
                acquired.push(*id);
            }
        }
        self.dispatch(scale_set);
        acquired
    }

    /// Moves a scale set's jobs along as far as they can go now: held jobs
    /// are assigned to the set while its capacity allows, then jobs waiting
    /// in the set are handed to its online idle runners.
    fn dispatch(&mut self, scale_set: u64) {
        self.assign_to_scale_set(scale_set);
        self.hand_to_runners(scale_set);
    }

    /// Assigns held jobs, oldest first, to their scale set as far as
    /// [`assignable`] allows, each with a `JobAssigned`.
    fn assign_to_scale_set(&mut self, scale_set: u64) {
        let Some(capacity) = self.scale_sets.get(&scale_set).map(|s| s.max_capacity) else {
            return;
        };
        let of_set = || {
            self.jobs
                .values()
                .filter(move |j| j.scale_set == Some(scale_set))
        };
        let in_set = of_set().filter(|j| j.holds_capacity()).count() as u64;
        let held: Vec<u64> = of_set()
            .filter(|j| j.phase == JobPhase::Held)
            .map(|j| j.id)
            .collect();
        let take = assignable(capacity, in_set, held.len() as u64) as usize;
        for job_id in held.into_iter().take(take) {
            let Some(job) = self.jobs.get_mut(&job_id) else {
                continue;
            };
            job.phase = JobPhase::Acquired;
            job.scale_set_assigned = Some(Timestamp::now());
            let times = job.times(None);
            let item = self.job_message(job_id, "JobAssigned", times);
            self.post(scale_set, item);
        }
    }

    /// Hands jobs waiting in a scale set, oldest first, to its online idle
    /// runners, lowest id first. No message: the runner's `JobStarted`
    /// reports it, with the `runnerAssignTime` recorded here.
    fn hand_to_runners(&mut self, scale_set: u64) {
        loop {
            let Some(job_id) = self
                .jobs
                .values()
                .find(|j| j.scale_set == Some(scale_set) && j.phase == JobPhase::Acquired)
                .map(|j| j.id)
            else {
                return;
            };
            let Some(runner) = self
                .runners
                .values_mut()
                .find(|r| r.scale_set == scale_set && r.online && r.job.is_none())
            else {
                return;
            };
            runner.job = Some(job_id);
            let runner_id = runner.id;
            if let Some(job) = self.jobs.get_mut(&job_id) {
                job.phase = JobPhase::Assigned;
                job.runner = Some(runner_id);
                let now = Timestamp::now();
                job.runner_assigned = Some(job.scale_set_assigned.map_or(now, |t| t.max(now)));
            }
        }
    }

    /// The common fields of every job message, plus `extra`.
    fn job_message(&self, job_id: u64, kind: &str, extra: Value) -> Value {
        let Some(job) = self.jobs.get(&job_id) else {
            return json!({"messageType": kind, "runnerRequestId": job_id});
        };
        let owner = job
            .scale_set
            .and_then(|s| self.scale_sets.get(&s))
            .and_then(|s| s.tenant.checked_sub(1))
            .and_then(|i| self.tenants.get(i as usize))
            .map_or("octo-org", |t| t.owner.as_str());
        let repository = job
            .repository
            .clone()
            .unwrap_or_else(|| format!("{owner}/app"));
        let (owner_name, repo_name) = repository
            .split_once('/')
            .map_or((owner.to_owned(), repository.clone()), |(o, r)| {
                (o.to_owned(), r.to_owned())
            });
        let mut message = json!({
            "messageType": kind,
            "runnerRequestId": job.id,
            "repositoryName": repo_name,
            "ownerName": owner_name,
            "jobId": job.job_id,
            "jobWorkflowRef": format!("{owner_name}/{repo_name}/.github/workflows/ci.yml@refs/heads/main"),
            "jobDisplayName": display_name(job.id),
            "workflowRunId": job.id + 500_000,
            "eventName": "push",
            "requestLabels": job.labels,
            "queueTime": job.queue_time,
        });
        if let (Some(map), Value::Object(extra)) = (message.as_object_mut(), extra) {
            map.extend(extra);
        }
        message
    }

    fn available_message(&self, job_id: u64) -> Value {
        let set = self.jobs.get(&job_id).and_then(|j| j.scale_set);
        let tenant = set
            .and_then(|s| self.scale_sets.get(&s))
            .map_or(0, |s| s.tenant);
        self.job_message(
            job_id,
            "JobAvailable",
            json!({
                "acquireJobUrl": format!(
                    "{}/tenant/{tenant}/_apis/runtime/runnerscalesets/{}/acquirejobs",
                    self.settings.base_url, set.unwrap_or_default()
                ),
            }),
        )
    }

    /// Appends a job message to a scale set's queue, and to the history.
    fn post(&mut self, scale_set: u64, item: Value) {
        if let Some(set) = self.scale_sets.get_mut(&scale_set) {
            if self.posted.len() >= HISTORY_LIMIT {
                self.posted.pop_front();
                self.posted_dropped += 1;
            }
            self.posted.push_back(PostedMessage {
                at: now_rfc3339(),
                scale_set_id: scale_set,
                message: item.clone(),
            });
            set.pending.push_back(item);
        }
    }

    /// Every job message posted so far, oldest first.
    pub(crate) fn job_history(&self) -> JobHistory {
        JobHistory {
            dropped: self.posted_dropped,
            messages: self.posted.iter().cloned().collect(),
        }
    }

    pub(crate) fn jobs(&self) -> Vec<JobSnapshot> {
        self.jobs
            .values()
            .map(|j| JobSnapshot {
                id: j.id,
                labels: j.labels.clone(),
                phase: j.phase,
                scale_set_id: j.scale_set,
                runner_id: j.runner,
                result: j.result.map(str::to_owned),
                requeues: j.requeues,
            })
            .collect()
    }

    pub(crate) fn runners(&self) -> Vec<RunnerSnapshot> {
        self.runners
            .values()
            .map(|r| RunnerSnapshot {
                id: r.id,
                name: r.name.clone(),
                scale_set_id: r.scale_set,
                online: r.online,
                job_id: r.job,
            })
            .collect()
    }

    pub(crate) fn scale_set_summaries(&self) -> Vec<ScaleSetSnapshot> {
        self.scale_sets
            .values()
            .map(|s| ScaleSetSnapshot {
                id: s.id,
                name: s.name.clone(),
                runner_group_id: s.group_id,
                labels: s.labels.iter().map(|l| l.name.clone()).collect(),
                session_active: s.session.is_some(),
                max_capacity: s.max_capacity,
                statistics: self.statistics(s.id),
            })
            .collect()
    }

    // ----- sessions and the message queue ----------------------------------

    pub(crate) fn create_session(
        &mut self,
        tenant: u32,
        scale_set: u64,
        owner: &str,
    ) -> Result<Value, ServiceError> {
        self.create_session_at(tenant, scale_set, owner, Timestamp::now())
    }

    /// [`State::create_session`] at `now`: a session of the set that has
    /// not been polled for [`StateSettings::session_idle_expiry`] is
    /// expired first, as the service expires a dead listener's; a live one
    /// conflicts.
    fn create_session_at(
        &mut self,
        tenant: u32,
        scale_set: u64,
        owner: &str,
        now: Timestamp,
    ) -> Result<Value, ServiceError> {
        let set = self.scale_set(tenant, scale_set)?;
        if let Some(old) = set.session.clone() {
            let idle = self
                .sessions
                .get(&old)
                .map(|s| now.duration_since(s.last_polled).unsigned_abs());
            if idle.is_some_and(|idle| idle < self.settings.session_idle_expiry) {
                self.history.conflicts.push(SessionConflict {
                    at: now.into(),
                    scale_set_id: scale_set,
                    owner: owner.to_owned(),
                });
                return Err(ServiceError::SessionConflict { id: scale_set });
            }
            self.end_session(&old, true);
        }
        let id = random_uuid();
        let queue_token = random_token("");
        self.queue_tokens
            .insert(queue_token.clone(), (id.clone(), false));
        self.sessions.insert(
            id.clone(),
            Session {
                id: id.clone(),
                scale_set,
                owner: owner.to_owned(),
                queue_token,
                last_polled: now,
            },
        );
        self.history.sessions.push(SessionRecord {
            id: id.clone(),
            scale_set_id: scale_set,
            owner: owner.to_owned(),
            created: now.into(),
            polls: 0,
            last_poll: None,
            ended: None,
        });
        if let Some(set) = self.scale_sets.get_mut(&scale_set) {
            set.session = Some(id.clone());
        }
        // A new listener must learn of jobs still on offer whose
        // announcements an earlier listener consumed.
        let announced: HashSet<u64> = {
            let set = &self.scale_sets[&scale_set];
            set.pending
                .iter()
                .chain(set.messages.values().flatten())
                .filter(|m| m["messageType"] == "JobAvailable")
                .filter_map(|m| m["runnerRequestId"].as_u64())
                .collect()
        };
        let unannounced: Vec<u64> = self
            .jobs
            .values()
            .filter(|j| j.scale_set == Some(scale_set) && j.phase == JobPhase::Available)
            .filter(|j| !announced.contains(&j.id))
            .map(|j| j.id)
            .collect();
        for job in unannounced {
            let item = self.available_message(job);
            self.post(scale_set, item);
        }
        self.session_json(&id)
    }

    fn session_json(&self, id: &str) -> Result<Value, ServiceError> {
        let session = self
            .sessions
            .get(id)
            .ok_or_else(|| ServiceError::SessionNotFound(id.to_owned()))?;
        let set =
            self.scale_sets
                .get(&session.scale_set)
                .ok_or(ServiceError::ScaleSetNotFound {
                    id: session.scale_set,
                })?;
        Ok(json!({
            "sessionId": session.id,
            "ownerName": session.owner,
            "runnerScaleSet": self.scale_set_json(set),
            "messageQueueUrl": format!("{}/broker/{}/messages", self.settings.base_url, session.id),
            "messageQueueAccessToken": session.queue_token,
            "statistics": self.statistics(set.id),
        }))
    }

    fn session_of(&self, tenant: u32, scale_set: u64, id: &str) -> Result<(), ServiceError> {
        self.scale_set(tenant, scale_set)?;
        match self.sessions.get(id) {
            Some(s) if s.scale_set == scale_set => Ok(()),
            Some(_) | None if self.expired_sessions.contains(id) => {
                Err(ServiceError::SessionExpired(id.to_owned()))
            }
            _ => Err(ServiceError::SessionNotFound(id.to_owned())),
        }
    }

    /// `PATCH sessions/{id}`: a new queue token; the old one stops working.
    pub(crate) fn refresh_session(
        &mut self,
        tenant: u32,
        scale_set: u64,
        id: &str,
    ) -> Result<Value, ServiceError> {
        self.session_of(tenant, scale_set, id)?;
        let token = random_token("");
        if let Some(session) = self.sessions.get_mut(id) {
            let old = std::mem::replace(&mut session.queue_token, token.clone());
            self.queue_tokens.remove(&old);
        }
        self.queue_tokens.insert(token, (id.to_owned(), false));
        self.session_json(id)
    }

    pub(crate) fn delete_session(
        &mut self,
        tenant: u32,
        scale_set: u64,
        id: &str,
    ) -> Result<(), ServiceError> {
        self.scale_set(tenant, scale_set)?;
        if self
            .sessions
            .get(id)
            .is_some_and(|s| s.scale_set == scale_set)
        {
            self.end_session(id, false);
        }
        Ok(())
    }

    /// Ends a session; `expired` ones answer "expired" afterwards rather than
    /// "not found", as a session the service timed out does.
    fn end_session(&mut self, id: &str, expired: bool) {
        if let Some(session) = self.sessions.remove(id) {
            if let Some(record) = self.history.sessions.iter_mut().rev().find(|r| r.id == id) {
                record.ended = Some(SystemTime::now());
            }
            self.queue_tokens.remove(&session.queue_token);
            if let Some(set) = self.scale_sets.get_mut(&session.scale_set)
                && set.session.as_deref() == Some(id)
            {
                set.session = None;
            }
        }
        if expired {
            self.expired_sessions.insert(id.to_owned());
        }
    }

    /// Control: the service drops the scale set's session, as it does when it
    /// loses track of a listener. Returns whether there was one.
    /// Deletes the scale set `id` as an admin does in GitHub's settings (or
    /// the service after seven dormant days); refused, as the API refuses
    /// it, while its runners hold jobs.
    pub(crate) fn remove_scale_set(&mut self, id: u64) -> bool {
        let Some(tenant) = self.scale_sets.get(&id).map(|s| s.tenant) else {
            return false;
        };
        self.delete_scale_set(tenant, id).is_ok()
    }

    pub(crate) fn drop_session(&mut self, scale_set: u64) -> bool {
        let Some(id) = self
            .scale_sets
            .get(&scale_set)
            .and_then(|s| s.session.clone())
        else {
            return false;
        };
        self.end_session(&id, true);
        true
    }

    pub(crate) fn expire_queue_tokens(&mut self) {
        for (_, expired) in self.queue_tokens.values_mut() {
            *expired = true;
        }
    }

    /// The session (and its scale set) a queue token belongs to.
    /// Notes that a poll of session `id` began.
    pub(crate) fn note_poll(&mut self, id: &str) {
        if let Some(record) = self.history.sessions.iter_mut().rev().find(|r| r.id == id) {
            record.polls += 1;
            record.last_poll = Some(SystemTime::now());
        }
    }

    /// Notes that session `session` acquired `jobs`.
    pub(crate) fn note_acquisition(&mut self, session: &str, jobs: &[u64]) {
        if !jobs.is_empty() {
            self.history.acquisitions.push(Acquisition {
                at: SystemTime::now(),
                session: session.to_owned(),
                jobs: jobs.to_vec(),
            });
        }
    }

    pub(crate) fn session_history(&self) -> SessionHistory {
        self.history.clone()
    }

    pub(crate) fn check_queue_token(&self, token: &str) -> Result<(String, u64), ServiceError> {
        match self.queue_tokens.get(token) {
            Some((_, true)) => Err(ServiceError::TokenExpired),
            Some((session, false)) => {
                let scale_set = self
                    .sessions
                    .get(session)
                    .map(|s| s.scale_set)
                    .ok_or(ServiceError::InvalidCredentials)?;
                Ok((session.clone(), scale_set))
            }
            None => Err(ServiceError::InvalidCredentials),
        }
    }

    /// The next message for a session: the first undeleted message after
    /// `last_id` (so unacknowledged messages are delivered again), else a new
    /// message batching up to `max_batch` pending job messages, else `None`.
    pub(crate) fn next_message(&mut self, scale_set: u64, last_id: u64) -> Option<Value> {
        let polled = self
            .scale_sets
            .get(&scale_set)
            .and_then(|set| set.session.as_ref())
            .and_then(|id| self.sessions.get_mut(id));
        if let Some(session) = polled {
            session.last_polled = Timestamp::now();
        }
        let max_batch = self.settings.max_batch.max(1);
        let redelivery = {
            let set = self.scale_sets.get(&scale_set)?;
            set.messages
                .range(last_id.saturating_add(1)..)
                .next()
                .map(|(id, _)| *id)
        };
        let id = match redelivery {
            Some(id) => id,
            None => {
                if self.scale_sets.get(&scale_set)?.pending.is_empty() {
                    return None;
                }
                let id = self.id();
                let set = self.scale_sets.get_mut(&scale_set)?;
                let take = set.pending.len().min(max_batch);
                let batch: Vec<Value> = set.pending.drain(..take).collect();
                set.messages.insert(id, batch);
                id
            }
        };
        let body = serde_json::to_string(&self.scale_sets.get(&scale_set)?.messages[&id])
            .unwrap_or_default();
        Some(json!({
            "messageId": id,
            "messageType": "RunnerScaleSetJobMessages",
            "body": body,
            "statistics": self.statistics(scale_set),
        }))
    }

    /// Acknowledges a message; deleting an unknown id is not an error.
    pub(crate) fn delete_message(&mut self, scale_set: u64, id: u64) {
        if let Some(set) = self.scale_sets.get_mut(&scale_set) {
            set.messages.remove(&id);
        }
    }
}

/// The body of create/update scale set; absent fields are left alone on update.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ScaleSetRequest {
    name: Option<String>,
    runner_group_id: Option<u64>,
    labels: Option<Vec<Label>>,
    #[serde(rename = "RunnerSetting")]
    runner_setting: Option<Value>,
}

fn display_name(job: u64) -> String {
    format!("build-{job}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(policy: VanishedJobPolicy) -> State {
        State::new(StateSettings {
            base_url: "http://fake".into(),
            vanished_jobs: policy,
            max_batch: 50,
            extra_runner_groups: vec!["gpu".into()],
            runtime: RuntimeSettings {
                assignment_timeout: TIMEOUT,
            },
            pat: "ghp_test".into(),
            session_idle_expiry: Duration::from_secs(120),
        })
    }

    const TIMEOUT: Duration = Duration::from_secs(60);

    /// A moment past the assignment timeout of every job assigned so far.
    fn after_timeout() -> Timestamp {
        Timestamp::now()
            .checked_add(TIMEOUT + Duration::from_millis(1))
            .unwrap()
    }

    /// Every job message posted so far, in order, taken off the queue.
    fn drain(s: &mut State, set: u64) -> Vec<Value> {
        let mut items = Vec::new();
        let mut last = 0;
        while let Some(m) = s.next_message(set, last) {
            last = m["messageId"].as_u64().unwrap();
            items.extend(serde_json::from_str::<Vec<Value>>(m["body"].as_str().unwrap()).unwrap());
            s.delete_message(set, last);
        }
        items
    }

    fn time(item: &Value, field: &str) -> Option<Timestamp> {
        item.get(field)
            .map(|t| t.as_str().unwrap().parse().unwrap())
    }

    /// A tenant and a scale set with labels, ready for jobs.
    fn with_scale_set(s: &mut State, labels: &[&str]) -> (u32, u64) {
        let (token, _) = s.issue_registration_token("/org".into(), 60);
        let tenant = s.register(&token, "http://fake/org").unwrap();
        let labels = labels
            .iter()
            .map(|l| Label {
                kind: "System".into(),
                name: (*l).into(),
            })
            .collect();
        let set = s
            .create_scale_set(
                tenant,
                ScaleSetRequest {
                    name: Some("set".into()),
                    labels: Some(labels),
                    ..Default::default()
                },
            )
            .unwrap();
        (tenant, set["id"].as_u64().unwrap())
    }

    fn jit(s: &mut State, tenant: u32, set: u64, name: &str) -> JitConfig {
        let v = s.generate_jit_config(tenant, set, name).unwrap();
        JitConfig::decode(v["encodedJITConfig"].as_str().unwrap()).unwrap()
    }

    fn kinds(message: &Value) -> Vec<String> {
        let body: Vec<Value> = serde_json::from_str(message["body"].as_str().unwrap()).unwrap();
        body.iter()
            .map(|m| m["messageType"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn a_rotated_pat_is_accepted_and_the_old_one_and_its_tokens_are_not() {
        let mut s = state(VanishedJobPolicy::Requeue);
        let (token, _) = s.issue_installation_token(3600);
        let generation = s.admin_generation;
        assert!(s.is_pat("ghp_test"));
        s.rotate_pat("ghp_new".into());
        assert!(s.is_pat("ghp_new"));
        assert!(!s.is_pat("ghp_test"));
        assert!(s.check_installation_token(&token).is_err());
        assert!(s.admin_generation > generation, "admin tokens expire");
    }

    #[test]
    fn a_job_walks_its_whole_life_and_the_statistics_follow() {
        let mut s = state(VanishedJobPolicy::Requeue);
        let (tenant, set) = with_scale_set(&mut s, &["linux"]);
        let ids = s.enqueue(&JobSpec::new(1, &["linux"]));
        assert_eq!(s.statistics(set).total_available_jobs, 1);
        let m = s.next_message(set, 0).unwrap();
        assert_eq!(kinds(&m), ["JobAvailable"]);
        s.delete_message(set, m["messageId"].as_u64().unwrap());

        assert_eq!(s.acquire(set, &ids), ids);
        assert_eq!(s.acquire(set, &ids), Vec::<u64>::new(), "acquire is once");
        assert_eq!(s.statistics(set).total_assigned_jobs, 1);

        let config = jit(&mut s, tenant, set, "r1");
        s.connect(&config).unwrap();
        let stats = s.statistics(set);
        assert_eq!((stats.total_busy_runners, stats.total_idle_runners), (1, 0));
        let job = s.take_job(&config).unwrap().unwrap();
        assert_eq!(job.runner_request_id, ids[0]);
        assert_eq!(s.statistics(set).total_running_jobs, 1);
        assert!(matches!(
            s.remove_runner(tenant, config.runner_id),
            Err(ServiceError::JobStillRunning { .. })
        ));
        s.complete(&config).unwrap();

        let m2 = s
            .next_message(set, m["messageId"].as_u64().unwrap())
            .unwrap();
        assert_eq!(kinds(&m2), ["JobAssigned", "JobStarted", "JobCompleted"]);
        let ledger = s.ledger();
        assert_eq!(ledger.jobs_succeeded, 1);
        assert_eq!(ledger.self_deregistered, 1);
        assert_eq!(ledger.still_registered, 0);
        assert_eq!(
            s.remove_runner(tenant, config.runner_id),
            Ok(Removal::AlreadyGone)
        );
    }

    #[test]
    fn capacity_bounds_what_is_assigned_and_never_takes_back() {
        // (capacity, already in the set, held) -> assigned now
        let cases = [
            (None, 0, 5, 5),
            (None, 7, 5, 5),
            (Some(10), 0, 5, 5),
            (Some(2), 0, 5, 2),
            (Some(2), 1, 5, 1),
            (Some(2), 2, 5, 0),
            (Some(2), 4, 5, 0),
            (Some(0), 0, 3, 0),
            (Some(3), 0, 0, 0),
        ];
        for (capacity, in_set, held, expected) in cases {
            assert_eq!(
                assignable(capacity, in_set, held),
                expected,
                "capacity {capacity:?}, {in_set} in the set, {held} held"
            );
        }
    }

    #[test]
    fn a_cancelled_job_is_requeued_three_times_at_most() {
        use Cancellation::{RunnerVanished, Unclaimed};
        use VanishedJobPolicy::{Cancel, Requeue};
        // (why, policy, requeues so far) -> offered again
        let cases = [
            (Unclaimed, Requeue, 0, true),
            (Unclaimed, Requeue, 2, true),
            (Unclaimed, Requeue, 3, false),
            (Unclaimed, Cancel, 0, true),
            (RunnerVanished, Requeue, 0, true),
            (RunnerVanished, Requeue, 3, false),
            (RunnerVanished, Cancel, 0, false),
        ];
        for (why, policy, requeues, expected) in cases {
            assert_eq!(
                requeued(why, policy, requeues),
                expected,
                "{why:?} under {policy:?} after {requeues}"
            );
        }
    }

    #[test]
    fn acquired_jobs_are_assigned_to_the_set_with_statistics_that_count_them() {
        let mut s = state(VanishedJobPolicy::Requeue);
        let (_, set) = with_scale_set(&mut s, &[]);
        let ids = s.enqueue(&JobSpec::new(2, &[]));
        let offered = s.next_message(set, 0).unwrap();
        s.delete_message(set, offered["messageId"].as_u64().unwrap());
        assert_eq!(offered["statistics"]["totalAssignedJobs"], 0);

        s.acquire(set, &ids);
        let assigned = s.next_message(set, 0).expect("the assignment is a message");
        assert_eq!(kinds(&assigned), ["JobAssigned", "JobAssigned"]);
        assert_eq!(assigned["statistics"]["totalAssignedJobs"], 2);
        assert_eq!(assigned["statistics"]["totalAcquiredJobs"], 2);
        let items: Vec<Value> = serde_json::from_str(assigned["body"].as_str().unwrap()).unwrap();
        assert!(time(&items[0], "scaleSetAssignTime").is_some());
        assert!(items[0].get("runnerAssignTime").is_none());
        assert!(items[0].get("runnerId").is_none());
    }

    #[test]
    fn the_max_capacity_holds_jobs_back_until_a_place_frees() {
        let mut s = state(VanishedJobPolicy::Requeue);
        let (tenant, set) = with_scale_set(&mut s, &[]);
        assert!(s.set_max_capacity(set, Some(2)));
        assert!(!s.set_max_capacity(set, Some(2)), "unchanged");
        let ids = s.enqueue(&JobSpec::new(5, &[]));
        drain(&mut s, set);
        s.acquire(set, &ids);
        let phases = |s: &State| s.jobs().iter().map(|j| j.phase).collect::<Vec<_>>();
        use JobPhase::{Acquired, Assigned, Finished, Held};
        assert_eq!(phases(&s), [Acquired, Acquired, Held, Held, Held]);
        let stats = s.statistics(set);
        assert_eq!(
            (stats.total_assigned_jobs, stats.total_acquired_jobs),
            (2, 5)
        );
        assert_eq!(kinds_of(&drain(&mut s, set)), ["JobAssigned"; 2]);

        // A runner finishing one frees its place for the oldest held job.
        let config = jit(&mut s, tenant, set, "r1");
        s.connect(&config).unwrap();
        s.take_job(&config).unwrap().unwrap();
        s.complete(&config).unwrap();
        assert_eq!(phases(&s), [Finished, Acquired, Acquired, Held, Held]);
        assert_eq!(
            kinds_of(&drain(&mut s, set)),
            ["JobStarted", "JobCompleted", "JobAssigned"]
        );

        // Lowered, nothing is taken back; raised, the rest is assigned.
        s.set_max_capacity(set, Some(1));
        assert_eq!(phases(&s), [Finished, Acquired, Acquired, Held, Held]);
        s.set_max_capacity(set, None);
        assert_eq!(
            phases(&s),
            [Finished, Acquired, Acquired, Acquired, Acquired]
        );
        let r2 = jit(&mut s, tenant, set, "r2");
        s.connect(&r2).unwrap();
        assert_eq!(phases(&s)[1], Assigned, "the oldest goes to the runner");
    }

    fn kinds_of(items: &[Value]) -> Vec<String> {
        items
            .iter()
            .map(|m| m["messageType"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn a_job_no_runner_takes_is_cancelled_offered_again_and_given_up_after_three() {
        let mut s = state(VanishedJobPolicy::Requeue);
        let (_, set) = with_scale_set(&mut s, &[]);
        let ids = s.enqueue(&JobSpec::new(1, &[]));
        let mut seen = drain(&mut s, set);
        for round in 0..=MAX_REQUEUES {
            assert_eq!(s.acquire(set, &ids), ids, "round {round}");
            let expiry = s.expire_unclaimed(Timestamp::now());
            assert_eq!(expiry.cancelled, 0, "not before the timeout");
            assert!(expiry.next_deadline.is_some());
            let expiry = s.expire_unclaimed(after_timeout());
            assert_eq!(expiry.cancelled, 1, "round {round}");
            seen.extend(drain(&mut s, set));
        }
        assert_eq!(s.expire_unclaimed(after_timeout()).next_deadline, None);
        let mut expected = vec!["JobAvailable"];
        for _ in 0..MAX_REQUEUES {
            expected.extend(["JobAssigned", "JobCompleted", "JobAvailable"]);
        }
        expected.extend(["JobAssigned", "JobCompleted"]);
        assert_eq!(kinds_of(&seen), expected);
        for completed in seen.iter().filter(|m| m["messageType"] == "JobCompleted") {
            assert_eq!(completed["result"], "canceled");
            assert!(
                completed.get("runnerAssignTime").is_none(),
                "no runner took it"
            );
            assert!(
                time(completed, "scaleSetAssignTime").unwrap()
                    <= time(completed, "finishTime").unwrap()
            );
        }
        let job = &s.jobs()[0];
        assert_eq!(
            (job.phase, job.result.as_deref(), job.requeues),
            (JobPhase::Finished, Some("canceled"), MAX_REQUEUES)
        );
        let ledger = s.ledger();
        assert_eq!(ledger.jobs_cancelled_unclaimed, u64::from(MAX_REQUEUES) + 1);
        assert_eq!(ledger.jobs_requeued, u64::from(MAX_REQUEUES));
        assert_eq!(ledger.jobs_cancelled, 1);
        assert_eq!(ledger.jobs_unfinished, 0);
        assert_eq!(ledger.jobs_cancelled_runner_vanished, 0);
    }

    #[test]
    fn the_place_a_removed_runner_frees_is_not_given_back_to_it() {
        let mut s = state(VanishedJobPolicy::Requeue);
        let (tenant, set) = with_scale_set(&mut s, &[]);
        s.set_max_capacity(set, Some(1));
        let ids = s.enqueue(&JobSpec::new(2, &[]));
        s.acquire(set, &ids);
        let config = jit(&mut s, tenant, set, "r1");
        s.connect(&config).unwrap();
        assert_eq!(s.jobs()[0].phase, JobPhase::Assigned);
        assert_eq!(s.jobs()[1].phase, JobPhase::Held);

        s.remove_runner(tenant, config.runner_id).unwrap();
        let jobs = s.jobs();
        assert_eq!(jobs[0].phase, JobPhase::Available, "offered again");
        assert_eq!(
            (jobs[1].phase, jobs[1].runner_id),
            (JobPhase::Acquired, None),
            "assigned to the set, waiting for a runner"
        );
        assert!(s.runners().is_empty());
    }

    #[test]
    fn a_job_handed_to_a_runner_does_not_time_out() {
        let mut s = state(VanishedJobPolicy::Requeue);
        let (tenant, set) = with_scale_set(&mut s, &[]);
        let ids = s.enqueue(&JobSpec::new(1, &[]));
        s.acquire(set, &ids);
        let config = jit(&mut s, tenant, set, "r1");
        s.connect(&config).unwrap();
        let expiry = s.expire_unclaimed(after_timeout());
        assert_eq!(
            expiry,
            Expiry {
                cancelled: 0,
                next_deadline: None
            }
        );
        assert_eq!(s.jobs()[0].phase, JobPhase::Assigned);
    }

    #[test]
    fn the_history_keeps_every_posted_message_with_its_set_and_time() {
        let mut s = state(VanishedJobPolicy::Requeue);
        let (tenant, set) = with_scale_set(&mut s, &[]);
        let before = Timestamp::now();
        let ids = s.enqueue(&JobSpec::new(1, &[]));
        s.acquire(set, &ids);
        let config = jit(&mut s, tenant, set, "r1");
        s.connect(&config).unwrap();
        s.take_job(&config).unwrap().unwrap();
        s.complete(&config).unwrap();
        // Delivered and deleted: the history does not depend on the queue.
        let delivered = drain(&mut s, set);
        let history = s.job_history();
        assert_eq!(history.dropped, 0);
        let messages: Vec<Value> = history.messages.iter().map(|m| m.message.clone()).collect();
        assert_eq!(messages, delivered);
        assert!(history.messages.iter().all(|m| m.scale_set_id == set));
        let times: Vec<Timestamp> = history
            .messages
            .iter()
            .map(|m| m.at.parse().unwrap())
            .collect();
        assert!(before <= times[0], "{before} {}", times[0]);
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    }

    #[test]
    fn the_history_keeps_the_newest_messages_past_its_limit() {
        let mut s = state(VanishedJobPolicy::Requeue);
        let (_, _set) = with_scale_set(&mut s, &[]);
        let count = u32::try_from(HISTORY_LIMIT).unwrap() + 2;
        let ids = s.enqueue(&JobSpec::new(count, &[]));
        let history = s.job_history();
        assert_eq!(history.dropped, 2);
        assert_eq!(history.messages.len(), HISTORY_LIMIT);
        assert_eq!(history.messages[0].message["runnerRequestId"], ids[2]);
    }

    #[test]
    fn job_messages_carry_times_in_order() {
        let mut s = state(VanishedJobPolicy::Requeue);
        let (tenant, set) = with_scale_set(&mut s, &[]);
        let ids = s.enqueue(&JobSpec::new(1, &[]));
        s.acquire(set, &ids);
        let config = jit(&mut s, tenant, set, "r1");
        s.connect(&config).unwrap();
        s.take_job(&config).unwrap().unwrap();
        s.complete(&config).unwrap();
        let items = drain(&mut s, set);
        assert_eq!(
            kinds_of(&items),
            ["JobAvailable", "JobAssigned", "JobStarted", "JobCompleted"]
        );
        let [available, assigned, started, completed] = &items[..] else {
            unreachable!()
        };
        for field in ["scaleSetAssignTime", "runnerAssignTime", "finishTime"] {
            assert!(available.get(field).is_none(), "{field} on JobAvailable");
        }
        let assign = time(assigned, "scaleSetAssignTime").unwrap();
        assert!(assigned.get("runnerAssignTime").is_none());
        assert_eq!(time(started, "scaleSetAssignTime"), Some(assign));
        let runner = time(started, "runnerAssignTime").unwrap();
        assert!(started.get("finishTime").is_none());
        assert_eq!(time(completed, "scaleSetAssignTime"), Some(assign));
        assert_eq!(time(completed, "runnerAssignTime"), Some(runner));
        let finish = time(completed, "finishTime").unwrap();
        assert!(
            assign <= runner && runner <= finish,
            "{assign} {runner} {finish}"
        );
        assert!(
            completed["finishTime"].as_str().unwrap().ends_with('Z'),
            "UTC: {completed}"
        );
    }

    #[test]
    fn removing_a_runner_with_an_assigned_job_cancels_and_requeues_it() {
        let mut s = state(VanishedJobPolicy::Requeue);
        let (tenant, set) = with_scale_set(&mut s, &[]);
        let ids = s.enqueue(&JobSpec::new(1, &[]));
        s.acquire(set, &ids);
        let config = jit(&mut s, tenant, set, "r1");
        s.connect(&config).unwrap();
        assert_eq!(
            s.remove_runner(tenant, config.runner_id),
            Ok(Removal::Removed)
        );
        let ledger = s.ledger();
        assert_eq!(ledger.jobs_cancelled_runner_vanished, 1);
        assert_eq!(ledger.jobs_requeued, 1);
        assert_eq!(s.jobs()[0].phase, JobPhase::Available);
        let m = s.next_message(set, 0).unwrap();
        assert_eq!(
            kinds(&m),
            [
                "JobAvailable",
                "JobAssigned",
                "JobCompleted",
                "JobAvailable"
            ]
        );
    }

    #[test]
    fn a_vanished_runner_cancels_its_job_for_good_under_the_cancel_policy() {
        let mut s = state(VanishedJobPolicy::Cancel);
        let (tenant, set) = with_scale_set(&mut s, &[]);
        let ids = s.enqueue(&JobSpec::new(1, &[]));
        s.acquire(set, &ids);
        let config = jit(&mut s, tenant, set, "r1");
        s.connect(&config).unwrap();
        s.take_job(&config).unwrap().unwrap();
        s.vanish(&config).unwrap();
        let ledger = s.ledger();
        assert_eq!(ledger.jobs_cancelled, 1);
        assert_eq!(ledger.jobs_cancelled_runner_vanished, 1);
        assert_eq!(
            ledger.still_registered, 1,
            "a vanished runner stays registered"
        );
        // Now idle and offline, it can be removed.
        assert_eq!(
            s.remove_runner(tenant, config.runner_id),
            Ok(Removal::Removed)
        );
    }

    #[test]
    fn requeues_stop_after_the_limit() {
        let mut s = state(VanishedJobPolicy::Requeue);
        let (tenant, set) = with_scale_set(&mut s, &[]);
        let ids = s.enqueue(&JobSpec::new(1, &[]));
        for round in 0..=MAX_REQUEUES {
            s.acquire(set, &ids);
            let config = jit(&mut s, tenant, set, &format!("r{round}"));
            s.connect(&config).unwrap();
            s.vanish(&config).unwrap();
        }
        let ledger = s.ledger();
        assert_eq!(ledger.jobs_requeued, u64::from(MAX_REQUEUES));
        assert_eq!(ledger.jobs_cancelled, 1);
        assert_eq!(ledger.jobs_unfinished, 0);
    }

    #[test]
    fn jobs_wait_for_a_matching_scale_set() {
        let mut s = state(VanishedJobPolicy::Requeue);
        let (_, set) = with_scale_set(&mut s, &["linux"]);
        s.enqueue(&JobSpec::new(2, &["linux", "gpu"]));
        assert!(s.jobs().iter().all(|j| j.phase == JobPhase::Queued));
        assert!(s.next_message(set, 0).is_none());
        let labels = ["linux", "gpu"]
            .iter()
            .map(|l| Label {
                kind: "System".into(),
                name: (*l).into(),
            })
            .collect();
        s.update_scale_set(
            1,
            set,
            ScaleSetRequest {
                labels: Some(labels),
                ..Default::default()
            },
        )
        .unwrap();
        assert!(s.jobs().iter().all(|j| j.phase == JobPhase::Available));
    }

    #[test]
    fn messages_batch_at_most_the_limit_and_redeliver_until_deleted() {
        let mut s = state(VanishedJobPolicy::Requeue);
        let (_, set) = with_scale_set(&mut s, &[]);
        s.enqueue(&JobSpec::new(120, &[]));
        let first = s.next_message(set, 0).unwrap();
        let id1 = first["messageId"].as_u64().unwrap();
        assert_eq!(kinds(&first).len(), 50);
        // Not deleted: asked again from 0, the same message comes back.
        assert_eq!(s.next_message(set, 0).unwrap()["messageId"], id1);
        let second = s.next_message(set, id1).unwrap();
        let id2 = second["messageId"].as_u64().unwrap();
        assert!(id2 > id1);
        let third = s.next_message(set, id2).unwrap();
        assert_eq!(kinds(&third).len(), 20);
        assert!(
            s.next_message(set, third["messageId"].as_u64().unwrap())
                .is_none()
        );
        s.delete_message(set, id1);
        assert_eq!(s.next_message(set, 0).unwrap()["messageId"], id2);
    }

    #[test]
    fn faults_are_consumed_per_call() {
        let mut s = state(VanishedJobPolicy::Requeue);
        s.inject(Fault::new(Endpoint::GetRunner, FaultKind::status(500), 2));
        assert_eq!(s.enter(Endpoint::GetRunner), Some(FaultKind::status(500)));
        assert_eq!(s.enter(Endpoint::RemoveRunner), None);
        assert_eq!(s.enter(Endpoint::GetRunner), Some(FaultKind::status(500)));
        assert_eq!(s.enter(Endpoint::GetRunner), None);
        let counters = s.counters();
        assert_eq!(counters.calls(Endpoint::GetRunner), 3);
        assert_eq!(counters.faults(Endpoint::GetRunner), 2);
        assert_eq!(counters.calls(Endpoint::RemoveRunner), 1);
    }

    #[test]
    fn sessions_are_one_per_scale_set_and_a_dropped_one_reads_as_expired() {
        let mut s = state(VanishedJobPolicy::Requeue);
        let (tenant, set) = with_scale_set(&mut s, &[]);
        let session = s.create_session(tenant, set, "a").unwrap();
        let id = session["sessionId"].as_str().unwrap().to_owned();
        assert_eq!(
            s.create_session(tenant, set, "b"),
            Err(ServiceError::SessionConflict { id: set })
        );
        let token = session["messageQueueAccessToken"].as_str().unwrap();
        assert_eq!(s.check_queue_token(token).unwrap().1, set);
        assert!(s.drop_session(set));
        assert_eq!(
            s.check_queue_token(token),
            Err(ServiceError::InvalidCredentials)
        );
        assert_eq!(
            s.refresh_session(tenant, set, &id),
            Err(ServiceError::SessionExpired(id.clone()))
        );
        s.create_session(tenant, set, "b").unwrap();
    }

    #[test]
    fn a_session_nobody_polls_expires_and_a_polled_one_does_not() {
        let mut s = state(VanishedJobPolicy::Requeue);
        let (tenant, set) = with_scale_set(&mut s, &[]);
        let idle = Duration::from_secs(120);
        let later = |by: Duration| Timestamp::now().checked_add(by).unwrap();
        let first = s.create_session(tenant, set, "dead").unwrap();
        assert_eq!(
            s.create_session_at(tenant, set, "b", later(idle / 2)),
            Err(ServiceError::SessionConflict { id: set })
        );
        let second = s
            .create_session_at(tenant, set, "b", later(idle + Duration::from_secs(1)))
            .unwrap();
        assert_ne!(first["sessionId"], second["sessionId"]);
        let dead = first["messageQueueAccessToken"].as_str().unwrap();
        assert_eq!(
            s.check_queue_token(dead),
            Err(ServiceError::InvalidCredentials)
        );

        // A poll keeps a session alive: measured from the poll, it is young.
        s.next_message(set, 0);
        assert_eq!(
            s.create_session_at(tenant, set, "c", later(idle / 2)),
            Err(ServiceError::SessionConflict { id: set })
        );
    }

    #[test]
    fn registration_checks_the_token_scope() {
        let mut s = state(VanishedJobPolicy::Requeue);
        let (token, _) = s.issue_registration_token("/org/repo".into(), 60);
        assert_eq!(
            s.register(&token, "http://fake/other"),
            Err(ServiceError::InvalidCredentials)
        );
        assert_eq!(s.register(&token, "http://fake/org/repo/"), Ok(1));
        let (ent, _) = s.issue_registration_token("/enterprises/e".into(), 60);
        assert_eq!(s.register(&ent, "http://fake/enterprises/e"), Ok(2));
        s.expire_github_tokens();
        assert_eq!(
            s.register(&token, "http://fake/org/repo"),
            Err(ServiceError::TokenExpired)
        );
    }
}
