//! The Actions client against the fake Actions service, over real HTTP.
//!
//! Every endpoint, every typed error, retries under injected faults (the
//! fake's counters prove the retries happened and stopped), admin token
//! renewal, queue token expiry, session conflicts, and a check that no
//! secret reaches `Debug`, `Display` or the logs.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod relay;

use arcwright::actions::{
    ActionsClient, ActionsError, AppCredentials, ClientOptions, ConfigUrl, Credentials,
    JitRunnerSetting, JobMessage, Label, ProxyConfig, RetryPolicy, RunnerScaleSet, Secret,
};
use fake_actions::{Endpoint, FakeActions, FakeConfig, Fault, FaultKind, JobSpec};

/// Retries fast enough for tests, with the production shape.
fn fast_options() -> ClientOptions {
    ClientOptions {
        timeout: Duration::from_secs(5),
        message_timeout: Duration::from_secs(10),
        retry: RetryPolicy {
            max_retries: 4,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(40),
            max_retry_after: Duration::from_secs(5),
        },
        allow_plain_http: true,
        ..ClientOptions::default()
    }
}

async fn start(config: FakeConfig) -> FakeActions {
    FakeActions::start(config).await.expect("the fake starts")
}

fn pat_client(fake: &FakeActions, config_url: &str) -> ActionsClient {
    pat_client_with(fake, config_url, fast_options())
}

fn pat_client_with(fake: &FakeActions, config_url: &str, options: ClientOptions) -> ActionsClient {
    ActionsClient::new(
        ConfigUrl::parse(config_url).expect("valid config URL"),
        Credentials::Token(Secret::new(fake.pat())),
        options,
    )
    .expect("client builds")
}

async fn create_scale_set(client: &ActionsClient, name: &str) -> RunnerScaleSet {
    client
        .create_runner_scale_set(&RunnerScaleSet::new(name, 1, &[]))
        .await
        .expect("scale set created")
}

fn calls(fake: &FakeActions, endpoint: Endpoint) -> u64 {
    fake.control().counters().calls(endpoint)
}

fn faults(fake: &FakeActions, endpoint: Endpoint) -> u64 {
    fake.control().counters().faults(endpoint)
}

/// Posts to the fake's runner-facing API, playing the runner that holds a
/// JIT config.
async fn runner_call(fake: &FakeActions, what: &str, jit: &Secret) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/_runner/{what}", fake.url()))
        .json(&serde_json::json!({"jitConfig": jit.expose()}))
        .send()
        .await
        .expect("runner call sent")
}

#[tokio::test]
async fn every_scope_bootstraps_with_a_pat() {
    let fake = start(FakeConfig::default()).await;
    for url in [
        fake.org_url("octo-org"),
        fake.repo_url("octo-org", "app"),
        fake.enterprise_url("octo-ent"),
    ] {
        let client = pat_client(&fake, &url);
        let group = client
            .get_runner_group_by_name("Default")
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!(group.id, 1, "{url}");
        assert!(group.is_default);
    }
    assert_eq!(calls(&fake, Endpoint::RegistrationToken), 3);
    assert_eq!(calls(&fake, Endpoint::RunnerRegistration), 3);
    assert_eq!(calls(&fake, Endpoint::AppInstallationToken), 0);
}

#[tokio::test]
async fn a_github_app_bootstraps_through_an_installation_token() {
    let fake = start(FakeConfig::default()).await;
    let app = fake.app_credentials();
    for issuer in [app.app_id.to_string(), app.client_id.clone()] {
        let credentials = AppCredentials::new(issuer, app.installation_id, &app.private_key_pem)
            .expect("key loads");
        let client = ActionsClient::new(
            ConfigUrl::parse(&fake.org_url("octo-org")).unwrap(),
            Credentials::App(credentials),
            fast_options(),
        )
        .unwrap();
        client
            .get_runner_group_by_name("Default")
            .await
            .expect("bootstrapped");
    }
    assert_eq!(calls(&fake, Endpoint::AppInstallationToken), 2);
    assert_eq!(calls(&fake, Endpoint::RunnerRegistration), 2);
}

#[tokio::test]
async fn a_wrong_pat_is_reported_without_the_token() {
    let fake = start(FakeConfig::default()).await;
    let client = ActionsClient::new(
        ConfigUrl::parse(&fake.org_url("octo-org")).unwrap(),
        Credentials::Token(Secret::new("ghp_wrongTokenValue123")),
        fast_options(),
    )
    .unwrap();
    let err = client
        .get_runner_group_by_name("Default")
        .await
        .expect_err("rejected");
    assert_eq!(err.status(), Some(401), "{err}");
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("ghp_wrongTokenValue123"), "{shown}");
    // 401 from the GitHub API is an answer, not a hiccup: one call only.
    assert_eq!(calls(&fake, Endpoint::RegistrationToken), 1);
}

#[tokio::test]
async fn runner_groups_are_found_by_name() {
    let fake = start(FakeConfig {
        extra_runner_groups: vec!["gpu pool".into()],
        ..FakeConfig::default()
    })
    .await;
    let client = pat_client(&fake, &fake.org_url("octo-org"));
    let gpu = client
        .get_runner_group_by_name("gpu pool")
        .await
        .expect("found");
    assert_eq!(
        (gpu.id, gpu.name.as_str(), gpu.is_default),
        (2, "gpu pool", false)
    );
    match client.get_runner_group_by_name("nope").await {
        Err(ActionsError::RunnerGroupNotFound { name }) => assert_eq!(name, "nope"),
        other => panic!("expected RunnerGroupNotFound, got {other:?}"),
    }
}

#[tokio::test]
async fn scale_set_lifecycle() {
    let fake = start(FakeConfig {
        extra_runner_groups: vec!["second".into()],
        ..FakeConfig::default()
    })
    .await;
    let client = pat_client(&fake, &fake.org_url("octo-org"));

    assert_eq!(
        client.get_runner_scale_set(1, "my-set").await.unwrap(),
        None
    );
    let created = client
        .create_runner_scale_set(&RunnerScaleSet::new("my-set", 1, &["gpu".to_string()]))
        .await
        .expect("created");
    assert!(created.id > 0);
    assert_eq!(
        created.labels,
        [Label::system("my-set"), Label::system("gpu")]
    );
    assert_eq!(created.name, "my-set");
    assert_eq!(created.runner_group_id, 1);
    assert!(created.runner_setting.disable_update);
    assert!(created.created_on.is_some());

    let by_name = client
        .get_runner_scale_set(1, "my-set")
        .await
        .unwrap()
        .expect("found by name");
    assert_eq!(by_name.id, created.id);
    let by_id = client.get_runner_scale_set_by_id(created.id).await.unwrap();
    assert_eq!(by_id.name, "my-set");

    let moved = client
        .update_runner_scale_set(
            created.id,
            &RunnerScaleSet {
                runner_group_id: 2,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (moved.runner_group_id, moved.runner_group_name.as_str()),
        (2, "second")
    );
    assert_eq!(moved.name, "my-set", "an update leaves unset fields alone");
    let renamed = client
        .update_runner_scale_set(
            created.id,
            &RunnerScaleSet {
                name: "renamed".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (renamed.name.as_str(), renamed.runner_group_id),
        ("renamed", 2)
    );

    // A second scale set of the same name is an answer the client has no
    // special meaning for: the status, type and message are kept.
    let dup = client
        .create_runner_scale_set(&RunnerScaleSet {
            name: "renamed".into(),
            runner_group_id: 2,
            ..Default::default()
        })
        .await
        .expect_err("duplicate");
    match &dup {
        ActionsError::Status {
            status: 409,
            type_name: Some(t),
            message,
            ..
        } => {
            assert!(t.contains("RunnerScaleSetExistsException"), "{t}");
            assert!(message.contains("renamed"), "{message}");
        }
        other => panic!("expected a 409 Status error, got {other:?}"),
    }

    client.delete_runner_scale_set(created.id).await.unwrap();
    match client.get_runner_scale_set_by_id(created.id).await {
        Err(ActionsError::ScaleSetNotFound { .. }) => {}
        other => panic!("expected ScaleSetNotFound, got {other:?}"),
    }
    assert_eq!(
        client.get_runner_scale_set(2, "renamed").await.unwrap(),
        None
    );
    for endpoint in [
        Endpoint::GetScaleSetByName,
        Endpoint::GetScaleSet,
        Endpoint::CreateScaleSet,
        Endpoint::UpdateScaleSet,
        Endpoint::DeleteScaleSet,
    ] {
        assert!(calls(&fake, endpoint) > 0, "{endpoint} was not called");
    }
}

#[tokio::test]
async fn jit_configs_and_runner_registrations() {
    let fake = start(FakeConfig::default()).await;
    let client = pat_client(&fake, &fake.org_url("octo-org"));
    let set = create_scale_set(&client, "jit-set").await;

    let setting = JitRunnerSetting {
        name: "jit-set-runner-a".into(),
        work_folder: "/work".into(),
    };
    let jit = client
        .generate_jit_runner_config(set.id, &setting)
        .await
        .expect("jit config");
    assert_eq!(jit.runner.name, "jit-set-runner-a");
    assert_eq!(jit.runner.runner_scale_set_id, set.id);
    let decoded = fake_actions::JitConfig::decode(jit.encoded_jit_config.expose())
        .expect("fake's JIT config");
    assert_eq!(decoded.runner_id as i64, jit.runner.id);

    match client.generate_jit_runner_config(set.id, &setting).await {
        Err(ActionsError::RunnerExists { operation, .. }) => {
            assert_eq!(operation.as_str(), "generate_jit_config")
        }
        other => panic!("expected RunnerExists, got {other:?}"),
    }
    match client
        .generate_jit_runner_config(set.id + 1000, &setting)
        .await
    {
        Err(ActionsError::ScaleSetNotFound { .. }) => {}
        other => panic!("expected ScaleSetNotFound, got {other:?}"),
    }

    let by_id = client
        .get_runner(jit.runner.id)
        .await
        .expect("runner by id");
    assert_eq!(by_id, jit.runner);
    let by_name = client
        .get_runner_by_name("jit-set-runner-a")
        .await
        .unwrap()
        .expect("runner by name");
    assert_eq!(by_name, jit.runner);
    assert_eq!(
        client.get_runner_by_name("no-such-runner").await.unwrap(),
        None
    );

    client.remove_runner(jit.runner.id).await.expect("removed");
    match client.get_runner(jit.runner.id).await {
        Err(ActionsError::RunnerNotFound { .. }) => {}
        other => panic!("expected RunnerNotFound, got {other:?}"),
    }
    // Removing a runner that is already gone succeeds: the outcome wanted.
    client
        .remove_runner(jit.runner.id)
        .await
        .expect("already gone is fine");
    let ledger = fake.control().ledger();
    assert_eq!(
        (
            ledger.removed_by_api,
            ledger.remove_calls_for_absent_runners
        ),
        (1, 1)
    );
}

#[tokio::test]
async fn a_session_delivers_acquires_and_acknowledges_jobs() {
    let fake = start(FakeConfig::default()).await;
    let client = pat_client(&fake, &fake.org_url("octo-org"));
    let set = create_scale_set(&client, "msg-set").await;
    let ids = fake.control().enqueue_jobs(JobSpec::new(2, &["msg-set"]));

    let session = client
        .create_message_session(set.id, "host-1")
        .await
        .expect("session");
    assert!(fake.control().has_session(set.id as u64));
    assert_eq!(session.scale_set_id(), set.id);
    assert!(
        session.statistics().is_some(),
        "a session comes with statistics"
    );

    let message = session
        .get_message(0, 10)
        .await
        .expect("poll")
        .expect("a message");
    let available: Vec<i64> = message
        .jobs
        .iter()
        .filter_map(|j| match j {
            JobMessage::JobAvailable { job, .. } => Some(job.runner_request_id),
            _ => None,
        })
        .collect();
    let mut expected: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
    expected.sort_unstable();
    let mut got = available.clone();
    got.sort_unstable();
    assert_eq!(got, expected);
    assert!(message.statistics.expect("statistics").total_available_jobs >= 2);

    session
        .delete_message(message.id)
        .await
        .expect("acknowledged");
    let acquired = session.acquire_jobs(&available).await.expect("acquired");
    assert_eq!(acquired.len(), 2);
    assert_eq!(session.acquire_jobs(&[]).await.unwrap(), Vec::<i64>::new());

    // Nothing else is on offer: the long poll ends empty, or with the
    // statistics update of the acquisition, never with the same message.
    if let Some(next) = session
        .get_message(message.id, 10)
        .await
        .expect("second poll")
    {
        assert!(next.id > message.id);
        assert_eq!(next.statistics.expect("statistics").total_acquired_jobs, 2);
    }
    let session_id = session.id();
    session.close().await.expect("closed");
    assert!(
        !fake.control().has_session(set.id as u64),
        "session {session_id} still active"
    );
    for endpoint in [
        Endpoint::CreateSession,
        Endpoint::GetMessage,
        Endpoint::DeleteMessage,
        Endpoint::AcquireJobs,
        Endpoint::DeleteSession,
    ] {
        assert!(calls(&fake, endpoint) > 0, "{endpoint} was not called");
    }
}

#[tokio::test]
async fn an_empty_long_poll_is_none() {
    let fake = start(FakeConfig {
        long_poll: Duration::from_millis(200),
        ..FakeConfig::default()
    })
    .await;
    let client = pat_client(&fake, &fake.org_url("octo-org"));
    let set = create_scale_set(&client, "quiet-set").await;
    let session = client
        .create_message_session(set.id, "host-1")
        .await
        .unwrap();
    assert_eq!(session.get_message(0, 5).await.expect("poll"), None);
}

#[tokio::test]
async fn removing_a_runner_with_a_running_job_is_job_still_running() {
    let fake = start(FakeConfig::default()).await;
    let client = pat_client(&fake, &fake.org_url("octo-org"));
    let set = create_scale_set(&client, "busy-set").await;
    let jit = client
        .generate_jit_runner_config(
            set.id,
            &JitRunnerSetting {
                name: "busy-runner".into(),
                work_folder: String::new(),
            },
        )
        .await
        .unwrap();
    assert!(
        runner_call(&fake, "connect", &jit.encoded_jit_config)
            .await
            .status()
            .is_success()
    );

    let session = client
        .create_message_session(set.id, "host-1")
        .await
        .unwrap();
    fake.control()
        .enqueue_jobs(JobSpec::new(1, &["busy-set"]).lasting(Duration::from_secs(600)));
    let message = session
        .get_message(0, 1)
        .await
        .unwrap()
        .expect("job offered");
    let ids: Vec<i64> = message
        .jobs
        .iter()
        .filter_map(|j| j.job().map(|j| j.runner_request_id))
        .collect();
    session.delete_message(message.id).await.unwrap();
    assert_eq!(session.acquire_jobs(&ids).await.unwrap(), ids);
    let taken = runner_call(&fake, "job", &jit.encoded_jit_config).await;
    assert_eq!(taken.status(), 200, "the runner got its job");

    match client.remove_runner(jit.runner.id).await {
        Err(ActionsError::JobStillRunning { message, .. }) => {
            assert!(message.contains("still running"), "{message}")
        }
        other => panic!("expected JobStillRunning, got {other:?}"),
    }
    assert_eq!(fake.control().ledger().remove_calls_refused_job_running, 1);
    // The refusal is an answer, not retried.
    assert_eq!(calls(&fake, Endpoint::RemoveRunner), 1);
}

#[tokio::test]
async fn a_second_session_is_a_conflict() {
    let fake = start(FakeConfig::default()).await;
    let client = pat_client(&fake, &fake.org_url("octo-org"));
    let set = create_scale_set(&client, "one-listener").await;
    let first = client
        .create_message_session(set.id, "host-1")
        .await
        .unwrap();
    match client.create_message_session(set.id, "host-2").await {
        Err(ActionsError::SessionConflict { operation, message }) => {
            assert_eq!(operation.as_str(), "create_session");
            assert!(message.contains("active message session"), "{message}");
        }
        other => panic!("expected SessionConflict, got {other:?}"),
    }
    assert_eq!(
        calls(&fake, Endpoint::CreateSession),
        2,
        "a conflict is not retried"
    );
    first.close().await.unwrap();
    let second = client
        .create_message_session(set.id, "host-2")
        .await
        .expect("free after close");
    second.close().await.unwrap();
}

#[tokio::test]
async fn an_expired_queue_token_costs_one_refresh() {
    let fake = start(FakeConfig {
        long_poll: Duration::from_millis(200),
        ..FakeConfig::default()
    })
    .await;
    let client = pat_client(&fake, &fake.org_url("octo-org"));
    let set = create_scale_set(&client, "token-set").await;
    let session = client
        .create_message_session(set.id, "host-1")
        .await
        .unwrap();
    let old_token = session.session().message_queue_access_token.clone();

    fake.control().expire_queue_tokens();
    assert_eq!(
        session
            .get_message(0, 1)
            .await
            .expect("refreshed and polled"),
        None
    );
    assert_eq!(calls(&fake, Endpoint::RefreshSession), 1);
    assert_eq!(
        calls(&fake, Endpoint::GetMessage),
        2,
        "one rejected poll, one good one"
    );
    assert_ne!(session.session().message_queue_access_token, old_token);

    fake.control().expire_queue_tokens();
    session
        .delete_message(1)
        .await
        .expect("delete after refresh");
    fake.control().expire_queue_tokens();
    let ids = fake.control().enqueue_jobs(JobSpec::new(1, &["token-set"]));
    let acquired = session
        .acquire_jobs(&[ids[0] as i64])
        .await
        .expect("acquire after refresh");
    assert!(acquired.len() <= 1);
    assert_eq!(calls(&fake, Endpoint::RefreshSession), 3);
}

#[tokio::test]
async fn a_dropped_session_is_reported_as_expired() {
    let fake = start(FakeConfig {
        long_poll: Duration::from_millis(200),
        ..FakeConfig::default()
    })
    .await;
    let client = pat_client(&fake, &fake.org_url("octo-org"));
    let set = create_scale_set(&client, "dropped-set").await;
    let session = client
        .create_message_session(set.id, "host-1")
        .await
        .unwrap();
    assert!(fake.control().drop_session(set.id as u64));
    match session.get_message(0, 1).await {
        Err(ActionsError::SessionExpired { .. }) => {}
        other => panic!("expected SessionExpired, got {other:?}"),
    }
    match session.refresh().await {
        Err(ActionsError::SessionExpired { operation, .. }) => {
            assert_eq!(operation.as_str(), "refresh_session")
        }
        other => panic!("expected SessionExpired, got {other:?}"),
    }
    // The listener's way out: a new session.
    client
        .create_message_session(set.id, "host-1")
        .await
        .expect("new session");
}

#[tokio::test]
async fn a_session_for_a_deleted_scale_set_is_scale_set_not_found() {
    let fake = start(FakeConfig::default()).await;
    let client = pat_client(&fake, &fake.org_url("octo-org"));
    let set = create_scale_set(&client, "gone-set").await;
    client.delete_runner_scale_set(set.id).await.unwrap();
    match client.create_message_session(set.id, "host-1").await {
        Err(ActionsError::ScaleSetNotFound { operation, .. }) => {
            assert_eq!(operation.as_str(), "create_session")
        }
        other => panic!("expected ScaleSetNotFound, got {other:?}"),
    }
}

#[tokio::test]
async fn admin_tokens_are_renewed_before_they_expire() {
    // A token that lives 30 s is always inside the 60 s renewal margin, so
    // every call must bootstrap again first.
    let fake = start(FakeConfig {
        admin_token_lifetime: Duration::from_secs(30),
        ..FakeConfig::default()
    })
    .await;
    let client = pat_client(&fake, &fake.org_url("octo-org"));
    for _ in 0..3 {
        client
            .get_runner_group_by_name("Default")
            .await
            .expect("call");
    }
    assert_eq!(calls(&fake, Endpoint::RunnerRegistration), 3);
    assert_eq!(calls(&fake, Endpoint::RegistrationToken), 3);

    // A long-lived token is reused.
    let fake = start(FakeConfig::default()).await;
    let client = pat_client(&fake, &fake.org_url("octo-org"));
    for _ in 0..3 {
        client
            .get_runner_group_by_name("Default")
            .await
            .expect("call");
    }
    assert_eq!(calls(&fake, Endpoint::RunnerRegistration), 1);
}

#[tokio::test]
async fn concurrent_calls_share_one_bootstrap() {
    let fake = start(FakeConfig::default()).await;
    let client = pat_client(&fake, &fake.org_url("octo-org"));
    let calls_in_flight: Vec<_> = (0..8)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.get_runner_group_by_name("Default").await })
        })
        .collect();
    for call in calls_in_flight {
        call.await.unwrap().expect("call");
    }
    assert_eq!(calls(&fake, Endpoint::RunnerRegistration), 1);
}

/// Options for tests that hold a bootstrap open: attempts wait as long as the
/// fake holds them, so a held bootstrap stays held for the whole test.
fn patient_options() -> ClientOptions {
    ClientOptions {
        timeout: Duration::from_secs(3600),
        ..fast_options()
    }
}

/// How long a call that must not wait for a bootstrap is given before the
/// test calls it stuck. Only a failing test ever waits this long.
const STUCK: Duration = Duration::from_secs(60);

/// A registration endpoint that holds each call for longer than any test.
fn held_registration() -> Fault {
    Fault::new(
        Endpoint::RunnerRegistration,
        FaultKind::delay(Duration::from_secs(3600)),
        1,
    )
}

#[tokio::test]
async fn a_slow_bootstrap_does_not_hold_up_a_session() {
    let fake = start(FakeConfig {
        long_poll: Duration::from_millis(200),
        ..FakeConfig::default()
    })
    .await;
    let client = pat_client_with(&fake, &fake.org_url("octo-org"), patient_options());
    let set = create_scale_set(&client, "steady-set").await;
    fake.control()
        .enqueue_jobs(JobSpec::new(2, &["steady-set"]));
    let session = client
        .create_message_session(set.id, "host-1")
        .await
        .unwrap();

    // The admin token is revoked and GitHub is slow: a call that needs the
    // admin token starts a bootstrap, which the fake holds open.
    fake.control().expire_admin_tokens();
    fake.control().inject(held_registration());
    let admin_call = tokio::spawn({
        let client = client.clone();
        async move { client.get_runner_group_by_name("Default").await }
    });
    fake.control()
        .wait_until(STUCK, |s| {
            s.counters.faults(Endpoint::RunnerRegistration) == 1
        })
        .await
        .expect("the bootstrap reached the slow registration");

    // The session has everything its calls need: they go on.
    let message = tokio::time::timeout(STUCK, session.get_message(0, 2))
        .await
        .expect("polling waited for the bootstrap")
        .expect("poll")
        .expect("a message");
    tokio::time::timeout(STUCK, session.delete_message(message.id))
        .await
        .expect("acknowledging waited for the bootstrap")
        .expect("acknowledged");
    let available: Vec<i64> = message
        .jobs
        .iter()
        .filter_map(|j| j.job().map(|j| j.runner_request_id))
        .collect();
    assert_eq!(available.len(), 2);
    let acquired = tokio::time::timeout(STUCK, session.acquire_jobs(&available))
        .await
        .expect("acquiring jobs waited for the bootstrap")
        .expect("acquired");
    assert_eq!(acquired.len(), 2);

    assert!(
        !admin_call.is_finished(),
        "the session's calls completed while the bootstrap was held open"
    );
    assert_eq!(calls(&fake, Endpoint::RunnerRegistration), 2);
    assert_eq!(calls(&fake, Endpoint::AcquireJobs), 1);
    admin_call.abort();
}

#[tokio::test]
async fn a_usable_admin_token_serves_while_it_is_renewed() {
    // Four minutes: more than the minute's margin, so the token is usable,
    // and inside the five-minute renewal window from the start.
    let fake = start(FakeConfig {
        admin_token_lifetime: Duration::from_secs(240),
        ..FakeConfig::default()
    })
    .await;
    let client = pat_client_with(&fake, &fake.org_url("octo-org"), patient_options());
    client
        .get_runner_group_by_name("Default")
        .await
        .expect("first bootstrap");
    assert_eq!(calls(&fake, Endpoint::RunnerRegistration), 1);

    // The renewal the next call starts is held open by the fake; that call
    // and the ones after it go on with the token they have.
    fake.control().inject(held_registration());
    for _ in 0..3 {
        tokio::time::timeout(STUCK, client.get_runner_group_by_name("Default"))
            .await
            .expect("a call waited for the renewal")
            .expect("call");
    }
    tokio::time::timeout(STUCK, client.get_runner_scale_set(1, "none"))
        .await
        .expect("a call waited for the renewal")
        .expect("call");
    fake.control()
        .wait_until(STUCK, |s| {
            s.counters.faults(Endpoint::RunnerRegistration) == 1
        })
        .await
        .expect("a renewal started in the background");
    assert_eq!(
        calls(&fake, Endpoint::RunnerRegistration),
        2,
        "one renewal, not one per call"
    );
    assert_eq!(calls(&fake, Endpoint::GetRunnerGroupByName), 4);
}

#[tokio::test]
async fn a_failed_renewal_leaves_the_token_serving() {
    let fake = start(FakeConfig {
        admin_token_lifetime: Duration::from_secs(240),
        ..FakeConfig::default()
    })
    .await;
    let client = pat_client(&fake, &fake.org_url("octo-org"));
    client.get_runner_group_by_name("Default").await.unwrap();

    // The renewal the next call starts is refused; the calls go on with
    // the token they have, and the renewal is not tried again on each one.
    fake.control().inject(Fault::new(
        Endpoint::RunnerRegistration,
        FaultKind::status(400),
        1,
    ));
    client.get_runner_group_by_name("Default").await.unwrap();
    fake.control()
        .wait_until(STUCK, |s| {
            s.counters.faults(Endpoint::RunnerRegistration) == 1
        })
        .await
        .expect("the renewal was refused");
    for _ in 0..3 {
        client
            .get_runner_group_by_name("Default")
            .await
            .expect("the current token still serves");
    }
    assert_eq!(calls(&fake, Endpoint::RunnerRegistration), 2);
    assert_eq!(calls(&fake, Endpoint::GetRunnerGroupByName), 5);
}

#[tokio::test]
async fn a_revoked_admin_token_is_replaced_once() {
    let fake = start(FakeConfig::default()).await;
    let client = pat_client(&fake, &fake.org_url("octo-org"));
    client.get_runner_group_by_name("Default").await.unwrap();
    fake.control().expire_admin_tokens();
    client
        .get_runner_group_by_name("Default")
        .await
        .expect("renewed after 401");
    assert_eq!(calls(&fake, Endpoint::RunnerRegistration), 2);
    assert_eq!(calls(&fake, Endpoint::GetRunnerGroupByName), 3);

    // If the fresh token is refused too, that is reported, not looped on.
    fake.control().inject(Fault::new(
        Endpoint::GetRunnerGroupByName,
        FaultKind::status(401),
        2,
    ));
    match client.get_runner_group_by_name("Default").await {
        Err(ActionsError::AdminTokenExpired { .. }) => {}
        other => panic!("expected AdminTokenExpired, got {other:?}"),
    }
    assert_eq!(calls(&fake, Endpoint::RunnerRegistration), 3);
}

#[tokio::test]
async fn server_errors_are_retried_until_they_clear() {
    let fake = start(FakeConfig::default()).await;
    let client = pat_client(&fake, &fake.org_url("octo-org"));
    fake.control().inject(Fault::new(
        Endpoint::RunnerRegistration,
        FaultKind::status(503),
        2,
    ));
    fake.control().inject(Fault::new(
        Endpoint::GetRunnerGroupByName,
        FaultKind::status(500),
        3,
    ));
    client
        .get_runner_group_by_name("Default")
        .await
        .expect("succeeds after retries");
    assert_eq!(
        (
            calls(&fake, Endpoint::RunnerRegistration),
            faults(&fake, Endpoint::RunnerRegistration)
        ),
        (3, 2)
    );
    assert_eq!(
        (
            calls(&fake, Endpoint::GetRunnerGroupByName),
            faults(&fake, Endpoint::GetRunnerGroupByName)
        ),
        (4, 3)
    );
}

#[tokio::test]
async fn creating_calls_are_not_repeated_when_the_service_may_have_acted() {
    let fake = start(FakeConfig::default()).await;
    let client = pat_client(&fake, &fake.org_url("octo-org"));
    let set = create_scale_set(&client, "once-set").await;
    let setting = JitRunnerSetting {
        name: "once-set-runner".into(),
        work_folder: String::new(),
    };

    // A 5xx may come after the registration was made, and a 503 from a
    // gateway is no exception: reported after one call, not retried.
    for status in [500, 502, 503, 504] {
        let before = calls(&fake, Endpoint::GenerateJitConfig);
        fake.control().inject(Fault::new(
            Endpoint::GenerateJitConfig,
            FaultKind::status(status),
            1,
        ));
        let err = client
            .generate_jit_runner_config(set.id, &setting)
            .await
            .expect_err("the failure is reported");
        assert_eq!(err.status(), Some(status), "{err}");
        assert_eq!(
            calls(&fake, Endpoint::GenerateJitConfig) - before,
            1,
            "{status} was retried"
        );
    }
    let before = calls(&fake, Endpoint::CreateScaleSet);
    fake.control().inject(Fault::new(
        Endpoint::CreateScaleSet,
        FaultKind::status(503),
        1,
    ));
    let err = client
        .create_runner_scale_set(&RunnerScaleSet::new("once-more", 1, &[]))
        .await
        .expect_err("the 503 is reported");
    assert_eq!(err.status(), Some(503), "{err}");
    assert_eq!(calls(&fake, Endpoint::CreateScaleSet) - before, 1);

    // A rate limit says the service did not act: retried, and it succeeds.
    let before = calls(&fake, Endpoint::GenerateJitConfig);
    fake.control().inject(Fault::new(
        Endpoint::GenerateJitConfig,
        FaultKind::rate_limited(None),
        1,
    ));
    client
        .generate_jit_runner_config(set.id, &setting)
        .await
        .expect("retried after the 429");
    assert_eq!(calls(&fake, Endpoint::GenerateJitConfig) - before, 2);
}

#[tokio::test]
async fn a_session_conflict_after_a_lost_answer_is_backed_off_from() {
    let fake = start(FakeConfig::default()).await;
    let client = pat_client(&fake, &fake.org_url("octo-org"));
    let set = create_scale_set(&client, "orphan-set").await;

    // The answer to the first attempt is lost (a gateway's 503), and the
    // next ones meet the session it may have opened: the conflicts are
    // backed off from and retried until that session is gone.
    fake.control().inject(Fault::new(
        Endpoint::CreateSession,
        FaultKind::status(503),
        1,
    ));
    fake.control().inject(Fault::new(
        Endpoint::CreateSession,
        FaultKind::status(409),
        2,
    ));
    let session = client
        .create_message_session(set.id, "host-1")
        .await
        .expect("opened once the conflict cleared");
    assert_eq!(
        (
            calls(&fake, Endpoint::CreateSession),
            faults(&fake, Endpoint::CreateSession)
        ),
        (4, 3)
    );

    // A conflict with no lost answer before it is another listener's
    // session: reported at once.
    let before = calls(&fake, Endpoint::CreateSession);
    match client.create_message_session(set.id, "host-2").await {
        Err(ActionsError::SessionConflict { .. }) => {}
        other => panic!("expected SessionConflict, got {other:?}"),
    }
    assert_eq!(calls(&fake, Endpoint::CreateSession) - before, 1);

    // After a lost answer, a conflict that never clears is retried as far
    // as the retry budget goes, then reported.
    let before = calls(&fake, Endpoint::CreateSession);
    fake.control().inject(Fault::new(
        Endpoint::CreateSession,
        FaultKind::status(503),
        1,
    ));
    match client.create_message_session(set.id, "host-2").await {
        Err(ActionsError::SessionConflict { .. }) => {}
        other => panic!("expected SessionConflict, got {other:?}"),
    }
    assert_eq!(
        calls(&fake, Endpoint::CreateSession) - before,
        1 + u64::from(fast_options().retry.max_retries)
    );
    session.close().await.unwrap();
}

#[tokio::test]
async fn a_retried_delete_that_finds_nothing_has_succeeded() {
    let fake = start(FakeConfig::default()).await;
    let client = pat_client(&fake, &fake.org_url("octo-org"));

    // The fake's faults never act. A first attempt that did the work and
    // lost its answer is played by removing the object beforehand (the
    // scale set), or by a 404 after the 503 (the session, which the fake
    // deletes silently when it is already gone): either way the retry finds
    // nothing, which is what the delete was for.
    let set = create_scale_set(&client, "gone-set").await;
    let session = client
        .create_message_session(set.id, "host-1")
        .await
        .unwrap();
    fake.control().inject(Fault::new(
        Endpoint::DeleteSession,
        FaultKind::status(503),
        1,
    ));
    fake.control().inject(Fault::new(
        Endpoint::DeleteSession,
        FaultKind::status(404),
        1,
    ));
    session.close().await.expect("the session is gone");
    assert_eq!(
        (
            calls(&fake, Endpoint::DeleteSession),
            faults(&fake, Endpoint::DeleteSession)
        ),
        (2, 2)
    );

    client.delete_runner_scale_set(set.id).await.unwrap();
    fake.control().inject(Fault::new(
        Endpoint::DeleteScaleSet,
        FaultKind::status(502),
        1,
    ));
    client
        .delete_runner_scale_set(set.id)
        .await
        .expect("the scale set is gone");
    assert_eq!(
        (
            calls(&fake, Endpoint::DeleteScaleSet),
            faults(&fake, Endpoint::DeleteScaleSet)
        ),
        (3, 1)
    );

    // With no attempt before it that may have acted, a 404 is news.
    match client.delete_runner_scale_set(set.id).await {
        Err(ActionsError::ScaleSetNotFound { .. }) => {}
        other => panic!("expected ScaleSetNotFound, got {other:?}"),
    }
}

#[tokio::test]
async fn retries_are_bounded() {
    let fake = start(FakeConfig::default()).await;
    let client = pat_client(&fake, &fake.org_url("octo-org"));
    client.get_runner_group_by_name("Default").await.unwrap();
    fake.control().inject(Fault::new(
        Endpoint::GetScaleSetByName,
        FaultKind::status(502),
        100,
    ));
    let err = client
        .get_runner_scale_set(1, "x")
        .await
        .expect_err("gives up");
    match &err {
        ActionsError::Status {
            status: 502,
            retries: 4,
            ..
        } => {}
        other => panic!("expected a 502 after 4 retries, got {other:?}"),
    }
    assert_eq!(
        calls(&fake, Endpoint::GetScaleSetByName),
        5,
        "1 attempt + max_retries"
    );

    // 501 will not change: not retried at all.
    fake.control().clear_faults();
    fake.control().inject(Fault::new(
        Endpoint::GetScaleSet,
        FaultKind::status(501),
        100,
    ));
    assert_eq!(
        client
            .get_runner_scale_set_by_id(1)
            .await
            .expect_err("501")
            .status(),
        Some(501)
    );
    assert_eq!(calls(&fake, Endpoint::GetScaleSet), 1);
}

#[tokio::test]
async fn rate_limits_wait_for_retry_after() {
    let fake = start(FakeConfig::default()).await;
    let client = pat_client(&fake, &fake.org_url("octo-org"));
    client.get_runner_group_by_name("Default").await.unwrap();
    fake.control().inject(Fault::new(
        Endpoint::GetRunnerGroupByName,
        FaultKind::rate_limited(Some(1)),
        1,
    ));
    let started = Instant::now();
    client
        .get_runner_group_by_name("Default")
        .await
        .expect("after the wait");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After ignored: {:?}",
        started.elapsed()
    );
    assert_eq!(faults(&fake, Endpoint::GetRunnerGroupByName), 1);
}

#[tokio::test]
async fn connection_resets_are_retried() {
    let fake = start(FakeConfig::default()).await;
    let client = pat_client(&fake, &fake.org_url("octo-org"));
    client.get_runner_group_by_name("Default").await.unwrap();
    fake.control().inject(Fault::new(
        Endpoint::GetRunnerGroupByName,
        FaultKind::Reset,
        2,
    ));
    client
        .get_runner_group_by_name("Default")
        .await
        .expect("after resets");
    assert_eq!(faults(&fake, Endpoint::GetRunnerGroupByName), 2);

    fake.control().inject(Fault::new(
        Endpoint::GetRunnerGroupByName,
        FaultKind::Reset,
        100,
    ));
    match client.get_runner_group_by_name("Default").await {
        Err(ActionsError::Transport { retries: 4, .. }) => {}
        other => panic!("expected a transport error after 4 retries, got {other:?}"),
    }
}

#[tokio::test]
async fn slow_responses_time_out_and_are_retried() {
    let fake = start(FakeConfig::default()).await;
    let options = ClientOptions {
        timeout: Duration::from_millis(300),
        ..fast_options()
    };
    let client = pat_client_with(&fake, &fake.org_url("octo-org"), options);
    client.get_runner_group_by_name("Default").await.unwrap();
    fake.control().inject(Fault::new(
        Endpoint::GetRunnerGroupByName,
        FaultKind::delay(Duration::from_secs(2)),
        1,
    ));
    client
        .get_runner_group_by_name("Default")
        .await
        .expect("second attempt is fast");
    assert_eq!(calls(&fake, Endpoint::GetRunnerGroupByName), 3);

    fake.control().inject(Fault::new(
        Endpoint::GetRunnerGroupByName,
        FaultKind::delay(Duration::from_secs(2)),
        100,
    ));
    match client.get_runner_group_by_name("Default").await {
        Err(ActionsError::Timeout {
            after, retries: 4, ..
        }) => assert_eq!(after, Duration::from_millis(300)),
        other => panic!("expected a timeout after 4 retries, got {other:?}"),
    }
}

#[tokio::test]
async fn bodies_with_a_byte_order_mark_are_read() {
    let fake = start(FakeConfig {
        utf8_bom: true,
        long_poll: Duration::from_millis(200),
        ..FakeConfig::default()
    })
    .await;
    let client = pat_client(&fake, &fake.org_url("octo-org"));
    let set = create_scale_set(&client, "bom-set").await;
    fake.control().enqueue_jobs(JobSpec::new(1, &["bom-set"]));
    let session = client
        .create_message_session(set.id, "host-1")
        .await
        .expect("session with BOM");
    let message = session
        .get_message(0, 1)
        .await
        .expect("message with BOM")
        .expect("one");
    assert_eq!(message.jobs.len(), 1);
    match client.get_runner(424_242).await {
        Err(ActionsError::RunnerNotFound { .. }) => {}
        other => panic!("expected RunnerNotFound from a BOM-prefixed error, got {other:?}"),
    }
}

/// A `tracing` writer that keeps everything written to it.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn secrets_never_appear_in_debug_display_or_logs() {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let fake = start(FakeConfig {
        admin_token_lifetime: Duration::from_secs(30),
        ..FakeConfig::default()
    })
    .await;
    let app = fake.app_credentials();
    let app_credentials = AppCredentials::new(
        app.client_id.clone(),
        app.installation_id,
        &app.private_key_pem,
    )
    .unwrap();
    // Every request goes through a recording proxy, so the tokens the
    // client was handed (which the test cannot otherwise see) are known
    // from the Authorization headers they were sent in.
    let (proxy, seen) = relay::start_proxy();
    let through_proxy = ClientOptions {
        proxy: Some(ProxyConfig {
            http: Some(format!("http://{proxy}")),
            ..ProxyConfig::default()
        }),
        ..fast_options()
    };
    let app_client = ActionsClient::new(
        ConfigUrl::parse(&fake.org_url("octo-org")).unwrap(),
        Credentials::App(app_credentials.clone()),
        through_proxy.clone(),
    )
    .unwrap();
    let pat_client = pat_client_with(&fake, &fake.org_url("octo-org"), through_proxy);

    let set = create_scale_set(&app_client, "secret-set").await;
    let jit = app_client
        .generate_jit_runner_config(
            set.id,
            &JitRunnerSetting {
                name: "secret-runner".into(),
                work_folder: String::new(),
            },
        )
        .await
        .unwrap();
    let session = pat_client
        .create_message_session(set.id, "host-1")
        .await
        .unwrap();
    let queue_token = session
        .session()
        .message_queue_access_token
        .expose()
        .to_string();
    fake.control().expire_queue_tokens();
    fake.control()
        .inject(Fault::new(Endpoint::GetMessage, FaultKind::status(500), 1));
    let _ = session.get_message(0, 1).await;
    let refreshed_queue_token = session
        .session()
        .message_queue_access_token
        .expose()
        .to_string();

    let mut errors = Vec::new();
    errors.push(
        pat_client
            .create_message_session(set.id, "host-2")
            .await
            .expect_err("conflict"),
    );
    errors.push(
        app_client
            .generate_jit_runner_config(
                set.id,
                &JitRunnerSetting {
                    name: "secret-runner".into(),
                    work_folder: String::new(),
                },
            )
            .await
            .expect_err("exists"),
    );
    fake.control().expire_github_tokens();
    fake.control().inject(Fault::new(
        Endpoint::RunnerRegistration,
        FaultKind::status(400),
        1,
    ));
    errors.push(pat_client.get_runner(1).await.expect_err("bad bootstrap"));
    fake.control()
        .inject(Fault::new(Endpoint::GetMessage, FaultKind::Reset, 100));
    errors.push(session.get_message(0, 1).await.expect_err("reset"));

    // The credential of every request, by what it is.
    let sent = seen.lock().unwrap().clone();
    let credentials = |path: &str, scheme: &str| -> Vec<String> {
        let mut found: Vec<String> = sent
            .iter()
            .filter(|r| url::Url::parse(&r.target).unwrap().path().contains(path))
            .filter_map(|r| r.header("authorization"))
            .filter_map(|a| a.strip_prefix(scheme))
            .map(str::to_string)
            .collect();
        found.sort();
        found.dedup();
        found
    };
    let app_jwts = credentials("/access_tokens", "Bearer ");
    let github_tokens = credentials("/registration-token", "Bearer ");
    let registration_tokens = credentials("/actions/runner-registration", "RemoteAuth ");
    let admin_tokens = credentials("/tenant/", "Bearer ");
    let installation_tokens: Vec<String> = github_tokens
        .iter()
        .filter(|t| t.as_str() != fake.pat())
        .cloned()
        .collect();
    assert!(!app_jwts.is_empty(), "the App signed a JWT");
    assert!(
        !installation_tokens.is_empty(),
        "an installation token was used"
    );
    assert!(
        registration_tokens.len() >= 2,
        "registration tokens of both clients were used"
    );
    assert!(
        admin_tokens.len() >= 2,
        "admin tokens of both clients were used"
    );

    let mut secrets = vec![
        fake.pat().to_string(),
        app.private_key_pem.lines().nth(1).unwrap().to_string(),
        jit.encoded_jit_config.expose().to_string(),
        queue_token,
        refreshed_queue_token,
    ];
    secrets.extend(app_jwts);
    secrets.extend(installation_tokens);
    secrets.extend(registration_tokens);
    secrets.extend(admin_tokens);
    let mut shown = vec![
        format!("{:?}", Credentials::Token(Secret::new(fake.pat()))),
        format!("{:?}", Credentials::App(app_credentials.clone())),
        format!("{app_credentials:?}"),
        format!("{app_client:?}"),
        format!("{pat_client:?}"),
        format!("{jit:?}"),
        format!("{session:?}"),
        format!("{:?}", session.session()),
        format!("{:?}", Secret::new(fake.pat())),
    ];
    for err in &errors {
        shown.push(format!("{err}"));
        shown.push(format!("{err:?}"));
    }
    drop(_guard);
    shown.push(String::from_utf8(logs.0.lock().unwrap().clone()).unwrap());
    assert!(
        shown.last().is_some_and(|l| l.contains("retrying")),
        "the logs were captured"
    );
    for text in &shown {
        for secret in &secrets {
            assert!(
                !text.contains(secret.as_str()),
                "a secret leaked into: {text}"
            );
        }
    }
}

#[tokio::test]
async fn callers_waiting_on_a_failed_bootstrap_share_its_failure() {
    let fake = start(FakeConfig::default()).await;
    let client = pat_client(&fake, &fake.org_url("octo-org"));
    fake.control().inject(Fault::new(
        Endpoint::RegistrationToken,
        FaultKind::status(503),
        100,
    ));
    let waiting: Vec<_> = (0..8)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.get_runner_group_by_name("Default").await })
        })
        .collect();
    let mut shared = 0;
    for call in waiting {
        match call.await.unwrap() {
            Err(ActionsError::Status { status: 503, .. }) => {}
            Err(ActionsError::BootstrapFailed { reason }) => {
                assert!(reason.contains("503"), "{reason}");
                shared += 1;
            }
            other => panic!("expected the bootstrap's failure, got {other:?}"),
        }
    }
    assert_eq!(
        shared, 7,
        "one caller ran the bootstrap, the rest got its answer"
    );
    assert_eq!(
        calls(&fake, Endpoint::RegistrationToken),
        5,
        "one bootstrap's attempts, not eight"
    );

    // A later call tries again, and succeeds once the service is back.
    fake.control().clear_faults();
    client
        .get_runner_group_by_name("Default")
        .await
        .expect("bootstraps again");
}

#[tokio::test]
async fn a_queue_token_refused_after_a_refresh_is_reported() {
    let fake = start(FakeConfig {
        long_poll: Duration::from_millis(200),
        ..FakeConfig::default()
    })
    .await;
    let client = pat_client(&fake, &fake.org_url("octo-org"));
    let set = create_scale_set(&client, "refused-set").await;
    let session = client
        .create_message_session(set.id, "host-1")
        .await
        .unwrap();
    fake.control()
        .inject(Fault::new(Endpoint::GetMessage, FaultKind::status(401), 2));
    match session.get_message(0, 1).await {
        Err(ActionsError::QueueTokenExpired { operation }) => {
            assert_eq!(operation.as_str(), "get_message")
        }
        other => panic!("expected QueueTokenExpired, got {other:?}"),
    }
    assert_eq!(
        calls(&fake, Endpoint::RefreshSession),
        1,
        "one refresh, not a loop"
    );
    assert_eq!(calls(&fake, Endpoint::GetMessage), 2);
}

/// One pass over the whole protocol with App credentials, then a check
/// against the fake's own list of endpoints that the client called every
/// one it serves to clients (the runner-facing ones are the runner's).
#[tokio::test]
async fn every_endpoint_is_exercised() {
    let fake = start(FakeConfig {
        long_poll: Duration::from_millis(200),
        extra_runner_groups: vec!["blue".into()],
        ..FakeConfig::default()
    })
    .await;
    let app = fake.app_credentials();
    let client = ActionsClient::new(
        ConfigUrl::parse(&fake.org_url("octo-org")).unwrap(),
        Credentials::App(
            AppCredentials::new(app.client_id, app.installation_id, &app.private_key_pem).unwrap(),
        ),
        fast_options(),
    )
    .unwrap();

    let group = client.get_runner_group_by_name("blue").await.unwrap();
    assert_eq!(
        client.get_runner_scale_set(group.id, "all").await.unwrap(),
        None
    );
    let set = client
        .create_runner_scale_set(&RunnerScaleSet::new("all", group.id, &[]))
        .await
        .unwrap();
    client.get_runner_scale_set_by_id(set.id).await.unwrap();
    client
        .update_runner_scale_set(
            set.id,
            &RunnerScaleSet {
                runner_group_id: 1,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let jit = client
        .generate_jit_runner_config(
            set.id,
            &JitRunnerSetting {
                name: "all-1".into(),
                work_folder: String::new(),
            },
        )
        .await
        .unwrap();
    client.get_runner(jit.runner.id).await.unwrap();
    client.get_runner_by_name("all-1").await.unwrap();
    client.remove_runner(jit.runner.id).await.unwrap();

    fake.control().enqueue_jobs(JobSpec::new(1, &["all"]));
    let session = client
        .create_message_session(set.id, "host-1")
        .await
        .unwrap();
    session.refresh().await.unwrap();
    let message = session
        .get_message(0, 3)
        .await
        .unwrap()
        .expect("job offered");
    session.delete_message(message.id).await.unwrap();
    let ids: Vec<i64> = message
        .jobs
        .iter()
        .filter_map(|j| j.job().map(|j| j.runner_request_id))
        .collect();
    session.acquire_jobs(&ids).await.unwrap();
    session.close().await.unwrap();
    client.delete_runner_scale_set(set.id).await.unwrap();

    let counters = fake.control().counters();
    let runner_side = [
        Endpoint::RunnerConnect,
        Endpoint::RunnerJob,
        Endpoint::RunnerComplete,
        Endpoint::RunnerVanished,
    ];
    for endpoint in Endpoint::ALL
        .into_iter()
        .filter(|e| !runner_side.contains(e))
    {
        assert!(counters.calls(endpoint) > 0, "{endpoint} was never called");
    }
}

/// `--actions-hosts`: a configuration URL on a host the operator did not
/// list builds no client, and a service URL the server hands out on a host
/// that is neither the configuration's nor listed is never called, so the
/// controller cannot be aimed at the cluster's own addresses.
#[tokio::test]
async fn only_listed_hosts_and_the_services_own_are_called() {
    use arcwright::actions::hosts::HostPolicy;
    let fake = start(FakeConfig::default()).await;
    let listed = |entries: &[&str]| ClientOptions {
        hosts: HostPolicy::from_entries(entries).unwrap(),
        ..fast_options()
    };

    // The fake is not on the default list.
    let refused = ActionsClient::new(
        ConfigUrl::parse(&fake.org_url("octo")).unwrap(),
        Credentials::Token(Secret::new(fake.pat())),
        listed(&["github.com", "*.ghe.com"]),
    )
    .unwrap_err();
    assert!(
        matches!(&refused, ActionsError::InvalidConfigUrl { reason, .. } if reason.contains("--actions-hosts")),
        "{refused}"
    );

    // Listed, by its address: its service URLs are its own, and it works.
    let client = pat_client_with(&fake, &fake.org_url("octo"), listed(&["127.0.0.1"]));
    create_scale_set(&client, "listed").await;

    // Reached as localhost, the service it names is at 127.0.0.1, which is
    // neither the configuration's host nor listed: the bootstrap stops there.
    let port = fake.addr().port();
    let by_name = pat_client_with(
        &fake,
        &format!("http://localhost:{port}/octo"),
        listed(&["localhost"]),
    );
    let before = calls(&fake, Endpoint::GetRunnerGroupByName);
    let error = by_name
        .get_runner_group_by_name("Default")
        .await
        .unwrap_err();
    assert!(
        matches!(&error, ActionsError::HostRefused { host, .. } if host == "127.0.0.1"),
        "{error}"
    );
    assert_eq!(
        calls(&fake, Endpoint::GetRunnerGroupByName),
        before,
        "nothing was sent to the refused host"
    );
}
