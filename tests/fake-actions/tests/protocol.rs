//! Every endpoint of the fake through raw HTTP.

mod common;

use std::time::{Duration, Instant};

use common::*;
use fake_actions::{
    Endpoint, FakeConfig, Fault, FaultKind, JobOutcome, JobPhase, JobSpec, TEST_APP_PRIVATE_KEY,
};
use reqwest::{Method, StatusCode};
use serde_json::json;

#[tokio::test]
async fn registration_with_a_pat_returns_the_service_base_and_an_admin_jwt() {
    let fake = fake().await;
    let http = http();
    let admin = register(&http, &fake, "octo-org").await;
    assert!(
        admin.base.starts_with(&format!("{}/tenant/", fake.url())) && admin.base.ends_with('/'),
        "{}",
        admin.base
    );
    let claims = jwt_claims(&admin.token);
    let exp = claims["exp"].as_i64().expect("exp claim");
    let iat = claims["iat"].as_i64().expect("iat claim");
    assert_eq!(exp - iat, 600, "the default lifetime is ten minutes");

    // Repo and enterprise scopes have their own registration tokens.
    for path in [
        "repos/octo-org/app/actions/runners/registration-token",
        "enterprises/big/actions/runners/registration-token",
    ] {
        let answer = call(
            &http,
            Method::POST,
            &format!("{}/api/v3/{path}", fake.url()),
            Some(&format!("token {}", fake.pat())),
            None,
        )
        .await;
        assert_eq!(answer.status, StatusCode::CREATED, "{path}");
        assert!(answer.json["expires_at"].is_string());
    }

    // A token for one org does not register another.
    let token = call(
        &http,
        Method::POST,
        &format!(
            "{}/api/v3/orgs/a/actions/runners/registration-token",
            fake.url()
        ),
        Some(&format!("Bearer {}", fake.pat())),
        None,
    )
    .await;
    let wrong = call(
        &http,
        Method::POST,
        &format!("{}/api/v3/actions/runner-registration", fake.url()),
        Some(&format!(
            "RemoteAuth {}",
            token.json["token"].as_str().unwrap()
        )),
        Some(json!({"url": fake.org_url("b"), "runner_event": "register"})),
    )
    .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);

    // A wrong PAT gets nothing.
    let refused = call(
        &http,
        Method::POST,
        &format!(
            "{}/api/v3/orgs/a/actions/runners/registration-token",
            fake.url()
        ),
        Some("Bearer ghp_wrong"),
        None,
    )
    .await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
}

fn app_jwt(app_id: u64, pem: &str) -> String {
    let now = jiff::Timestamp::now().as_second();
    let claims = json!({"iss": app_id.to_string(), "iat": now - 60, "exp": now + 540});
    let key = jsonwebtoken::EncodingKey::from_rsa_pem(pem.as_bytes()).unwrap();
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256),
        &claims,
        &key,
    )
    .unwrap()
}

#[tokio::test]
async fn app_installation_tokens_require_a_jwt_signed_by_the_app_key() {
    let fake = fake().await;
    let http = http();
    let app = fake.app_credentials();
    let url = format!(
        "{}/api/v3/app/installations/{}/access_tokens",
        fake.url(),
        app.installation_id
    );
    let good = app_jwt(app.app_id, &app.private_key_pem);
    let answer = call(
        &http,
        Method::POST,
        &url,
        Some(&format!("Bearer {good}")),
        None,
    )
    .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    let installation_token = answer.json["token"].as_str().unwrap().to_owned();
    assert!(installation_token.starts_with("ghs_"));

    // The installation token works where a PAT does.
    let reg = call(
        &http,
        Method::POST,
        &format!(
            "{}/api/v3/orgs/o/actions/runners/registration-token",
            fake.url()
        ),
        Some(&format!("Bearer {installation_token}")),
        None,
    )
    .await;
    assert_eq!(reg.status, StatusCode::CREATED);

    // Another installation id is unknown; another key or app id is refused.
    let other = format!("{}/api/v3/app/installations/1/access_tokens", fake.url());
    let answer = call(
        &http,
        Method::POST,
        &other,
        Some(&format!("Bearer {good}")),
        None,
    )
    .await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    let forged = app_jwt(app.app_id, include_str!("../keys/service-private.pem"));
    let answer = call(
        &http,
        Method::POST,
        &url,
        Some(&format!("Bearer {forged}")),
        None,
    )
    .await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    let wrong_app = app_jwt(app.app_id + 1, TEST_APP_PRIVATE_KEY);
    let answer = call(
        &http,
        Method::POST,
        &url,
        Some(&format!("Bearer {wrong_app}")),
        None,
    )
    .await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);

    // Expired through the control API, the installation token stops working.
    fake.control().expire_github_tokens();
    let reg = call(
        &http,
        Method::POST,
        &format!(
            "{}/api/v3/orgs/o/actions/runners/registration-token",
            fake.url()
        ),
        Some(&format!("Bearer {installation_token}")),
        None,
    )
    .await;
    assert_eq!(reg.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn runner_groups_and_scale_sets_speak_the_service_shapes() {
    let fake = start(FakeConfig {
        extra_runner_groups: vec!["gpu-group".into()],
        ..FakeConfig::default()
    })
    .await;
    let http = http();
    let admin = register(&http, &fake, "org").await;

    let groups = admin
        .call(
            &http,
            Method::GET,
            "runtime/runnergroups/?groupName=Default",
            None,
        )
        .await;
    assert_eq!(groups.status, StatusCode::OK);
    assert_eq!(groups.json["count"], 1);
    assert_eq!(groups.json["value"][0]["isDefaultGroup"], true);
    let gpu = admin
        .call(
            &http,
            Method::GET,
            "runtime/runnergroups/?groupName=gpu-group",
            None,
        )
        .await;
    assert_eq!(gpu.json["value"][0]["id"], 2);
    let none = admin
        .call(
            &http,
            Method::GET,
            "runtime/runnergroups/?groupName=nope",
            None,
        )
        .await;
    assert_eq!(none.json["count"], 0);

    let id = scale_set(&http, &admin, "my-set", &["linux"]).await;
    let listed = fake.control().scale_sets();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].id, listed[0].labels.clone()),
        (id, vec!["linux".to_owned()])
    );
    let got = admin
        .call(
            &http,
            Method::GET,
            &format!("runtime/runnerscalesets/{id}"),
            None,
        )
        .await;
    assert_eq!(got.json["name"], "my-set");
    assert_eq!(got.json["RunnerSetting"]["disableUpdate"], true);
    assert_eq!(got.json["runnerGroupName"], "Default");
    assert!(got.json["statistics"]["totalAssignedJobs"].is_number());
    assert!(
        got.json["runnerJitConfigUrl"]
            .as_str()
            .unwrap()
            .ends_with("/generatejitconfig")
    );

    let by_name = admin
        .call(
            &http,
            Method::GET,
            "runtime/runnerscalesets?runnerGroupId=1&name=my-set",
            None,
        )
        .await;
    assert_eq!(by_name.json["count"], 1);
    assert_eq!(by_name.json["value"][0]["id"], id);

    let duplicate = admin
        .call(
            &http,
            Method::POST,
            "runtime/runnerscalesets",
            Some(json!({"name": "my-set", "runnerGroupId": 1})),
        )
        .await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT);

    let updated = admin
        .call(
            &http,
            Method::PATCH,
            &format!("runtime/runnerscalesets/{id}"),
            Some(json!({"runnerGroupId": 2, "RunnerSetting": {}, "createdOn": "0001-01-01T00:00:00Z"})),
        )
        .await;
    assert_eq!(updated.status, StatusCode::OK, "{updated:?}");
    assert_eq!(updated.json["runnerGroupId"], 2);
    assert_eq!(updated.json["name"], "my-set", "absent fields are kept");

    let deleted = admin
        .call(
            &http,
            Method::DELETE,
            &format!("runtime/runnerscalesets/{id}"),
            None,
        )
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    let gone = admin
        .call(
            &http,
            Method::GET,
            &format!("runtime/runnerscalesets/{id}"),
            None,
        )
        .await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    assert!(gone.type_name().contains("RunnerScaleSetNotFoundException"));

    // Another tenant cannot see this tenant's scale sets.
    let other = register(&http, &fake, "other-org").await;
    let mine = scale_set(&http, &admin, "mine", &[]).await;
    let hidden = other
        .call(
            &http,
            Method::GET,
            &format!("runtime/runnerscalesets/{mine}"),
            None,
        )
        .await;
    assert_eq!(hidden.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn jit_configs_name_the_runner_and_agents_can_be_found_and_removed() {
    let fake = fake().await;
    let http = http();
    let admin = register(&http, &fake, "org").await;
    let set = scale_set(&http, &admin, "set", &[]).await;
    let (id, encoded) = jit(&http, &admin, set, "runner-a").await;
    let config = fake_actions::JitConfig::decode(&encoded).unwrap();
    assert_eq!(config.runner_id, id);
    assert_eq!(config.runner_name, "runner-a");
    assert_eq!(config.scale_set_id, set);
    assert!(!config.secret.is_empty());

    let duplicate = admin
        .call(
            &http,
            Method::POST,
            &format!("runtime/runnerscalesets/{set}/generatejitconfig"),
            Some(json!({"name": "runner-a", "workFolder": ""})),
        )
        .await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT);
    assert!(duplicate.type_name().contains("AgentExistsException"));
    assert!(
        duplicate
            .type_name()
            .starts_with("GitHub.Actions.Runtime.WebApi.")
    );

    let got = admin
        .call(
            &http,
            Method::GET,
            &format!("distributedtask/pools/0/agents/{id}"),
            None,
        )
        .await;
    assert_eq!(got.json["name"], "runner-a");
    assert_eq!(got.json["runnerScaleSetId"], set);
    let by_name = admin
        .call(
            &http,
            Method::GET,
            "distributedtask/pools/0/agents?agentName=runner-a",
            None,
        )
        .await;
    assert_eq!(by_name.json["count"], 1);
    assert_eq!(by_name.json["value"][0]["id"], id);

    let removed = admin
        .call(
            &http,
            Method::DELETE,
            &format!("distributedtask/pools/0/agents/{id}"),
            None,
        )
        .await;
    assert_eq!(removed.status, StatusCode::NO_CONTENT);
    let again = admin
        .call(
            &http,
            Method::DELETE,
            &format!("distributedtask/pools/0/agents/{id}"),
            None,
        )
        .await;
    assert_eq!(again.status, StatusCode::NO_CONTENT, "already gone is 204");
    let missing = admin
        .call(
            &http,
            Method::GET,
            &format!("distributedtask/pools/0/agents/{id}"),
            None,
        )
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(missing.type_name().contains("AgentNotFoundException"));

    let ledger = fake.control().ledger();
    assert_eq!(ledger.runners_created, 1);
    assert_eq!(ledger.removed_by_api, 1);
    assert_eq!(ledger.remove_calls_for_absent_runners, 1);
    assert_eq!(ledger.duplicate_runner_names, 1);
    assert_eq!(ledger.still_registered, 0);
    // The name is free again.
    jit(&http, &admin, set, "runner-a").await;
}

#[tokio::test]
async fn a_job_runs_its_whole_life_through_the_protocol() {
    let fake = fake().await;
    let http = http();
    let admin = register(&http, &fake, "org").await;
    let set = scale_set(&http, &admin, "set", &["linux"]).await;
    let session = session(&http, &admin, set).await;
    assert!(session.json["statistics"]["totalAvailableJobs"].is_number());
    assert_eq!(session.json["runnerScaleSet"]["id"], set);

    let ids = fake.control().enqueue_jobs(
        JobSpec::new(1, &["linux"])
            .lasting(Duration::from_millis(10))
            .ending(JobOutcome::Failed),
    );
    let first = session.get(&http, 0).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.json["messageType"], "RunnerScaleSetJobMessages");
    let available = &items(&first.json)[0];
    assert_eq!(available["messageType"], "JobAvailable");
    assert_eq!(available["runnerRequestId"], ids[0]);
    assert_eq!(available["requestLabels"], json!(["linux"]));
    assert_eq!(first.json["statistics"]["totalAvailableJobs"], 1);
    let first_id = first.json["messageId"].as_u64().unwrap();
    assert_eq!(
        session.delete(&http, first_id).await.status,
        StatusCode::NO_CONTENT
    );

    let acquired = session.acquire(&http, &admin, set, &ids).await;
    assert_eq!(acquired.status, StatusCode::OK, "{acquired:?}");
    assert_eq!(acquired.json["value"], json!(ids));
    // The admin token is not the queue token.
    let with_admin = call(
        &http,
        Method::POST,
        &admin.url(&format!("runtime/runnerscalesets/{set}/acquirejobs")),
        Some(&admin.bearer()),
        Some(json!(ids)),
    )
    .await;
    assert_eq!(with_admin.status, StatusCode::UNAUTHORIZED);

    let (runner_id, config) = jit(&http, &admin, set, "r1").await;
    let connected = runner(&http, &fake, "connect", &config).await;
    assert_eq!(connected.json["runnerId"], runner_id);
    let job = runner(&http, &fake, "job", &config).await;
    assert_eq!(job.status, StatusCode::OK);
    assert_eq!(job.json["runnerRequestId"], ids[0]);
    assert_eq!(job.json["outcome"], "failed");

    // Busy: the registration cannot be removed.
    let refused = admin
        .call(
            &http,
            Method::DELETE,
            &format!("distributedtask/pools/0/agents/{runner_id}"),
            None,
        )
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert!(refused.type_name().contains("JobStillRunningException"));

    let done = runner(&http, &fake, "complete", &config).await;
    assert_eq!(done.json["result"], "failed");

    let second = session.get(&http, first_id).await;
    assert_eq!(
        kinds(&second.json),
        ["JobAssigned", "JobStarted", "JobCompleted"]
    );
    let started = &items(&second.json)[1];
    assert_eq!(started["runnerId"], runner_id);
    assert_eq!(started["runnerName"], "r1");
    assert_eq!(items(&second.json)[2]["result"], "failed");
    assert_eq!(second.json["statistics"]["totalAssignedJobs"], 0);

    let ledger = fake.control().ledger();
    assert_eq!(ledger.jobs_failed, 1);
    assert_eq!(ledger.self_deregistered, 1);
    assert_eq!(ledger.still_registered, 0);
    // The runner is gone; its config no longer works.
    let gone = runner(&http, &fake, "connect", &config).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_long_poll_answers_202_after_the_configured_wait_and_ids_grow() {
    let fake = start(FakeConfig {
        long_poll: Duration::from_millis(300),
        ..FakeConfig::default()
    })
    .await;
    let http = http();
    let admin = register(&http, &fake, "org").await;
    let set = scale_set(&http, &admin, "set", &[]).await;
    let session = session(&http, &admin, set).await;

    let started = Instant::now();
    let empty = session.get(&http, 0).await;
    assert_eq!(empty.status, StatusCode::ACCEPTED);
    assert!(started.elapsed() >= Duration::from_millis(300));

    // A poll in flight is answered as soon as a job arrives.
    let poll = {
        let http = http.clone();
        let url = session.queue_url.clone();
        let bearer = session.bearer();
        tokio::spawn(async move { call(&http, Method::GET, &url, Some(&bearer), None).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    fake.control().enqueue_jobs(JobSpec::new(1, &[]));
    let woken = poll.await.unwrap();
    assert!(
        woken.status == StatusCode::OK || woken.status == StatusCode::ACCEPTED,
        "{woken:?}"
    );

    let mut last = 0;
    let mut seen = Vec::new();
    for round in 0..3 {
        fake.control().enqueue_jobs(JobSpec::new(1, &[]));
        let message = session.get(&http, last).await;
        assert_eq!(message.status, StatusCode::OK, "round {round}");
        let id = message.json["messageId"].as_u64().unwrap();
        assert!(id > last, "ids grow: {id} after {last}");
        seen.extend(
            items(&message.json)
                .iter()
                .map(|m| m["runnerRequestId"].as_u64().unwrap()),
        );
        session.delete(&http, id).await;
        last = id;
    }
    let mut sorted = seen.clone();
    sorted.sort_unstable();
    assert_eq!(seen, sorted, "jobs are announced in order");
}

#[tokio::test]
async fn messages_batch_at_most_fifty_and_unacknowledged_ones_come_back() {
    let fake = fake().await;
    let http = http();
    let admin = register(&http, &fake, "org").await;
    let set = scale_set(&http, &admin, "set", &[]).await;
    let session = session(&http, &admin, set).await;
    let ids = fake.control().enqueue_jobs(JobSpec::new(120, &[]));

    let first = session.get(&http, 0).await;
    let first_id = first.json["messageId"].as_u64().unwrap();
    assert_eq!(items(&first.json).len(), 50);
    assert_eq!(first.json["statistics"]["totalAvailableJobs"], 120);
    // Not acknowledged: asked again without lastMessageId, it comes back.
    let again = session.get(&http, 0).await;
    assert_eq!(again.json["messageId"], first_id);

    let second = session.get(&http, first_id).await;
    let second_id = second.json["messageId"].as_u64().unwrap();
    let third = session.get(&http, second_id).await;
    assert_eq!(items(&second.json).len(), 50);
    assert_eq!(items(&third.json).len(), 20);
    let announced: Vec<u64> = [&first, &second, &third]
        .iter()
        .flat_map(|m| items(&m.json))
        .map(|m| m["runnerRequestId"].as_u64().unwrap())
        .collect();
    assert_eq!(announced, ids, "every job once, in order");

    session.delete(&http, first_id).await;
    let after_ack = session.get(&http, 0).await;
    assert_eq!(after_ack.json["messageId"], second_id);
}

#[tokio::test]
async fn sessions_conflict_refresh_and_end() {
    let fake = fake().await;
    let http = http();
    let admin = register(&http, &fake, "org").await;
    let set = scale_set(&http, &admin, "set", &[]).await;
    assert!(!fake.control().has_session(set));
    let first = session(&http, &admin, set).await;
    assert!(fake.control().has_session(set));

    let second = admin
        .call(
            &http,
            Method::POST,
            &format!("runtime/runnerscalesets/{set}/sessions"),
            Some(json!({"sessionId": "00000000-0000-0000-0000-000000000000", "ownerName": "b"})),
        )
        .await;
    assert_eq!(second.status, StatusCode::CONFLICT);
    assert!(
        second
            .type_name()
            .contains("RunnerScaleSetSessionConflictException")
    );

    let missing = admin
        .call(
            &http,
            Method::POST,
            "runtime/runnerscalesets/99999999/sessions",
            Some(json!({"ownerName": "b"})),
        )
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(
        missing
            .type_name()
            .contains("RunnerScaleSetNotFoundException")
    );

    // An expired queue token is refused until the session is refreshed.
    fake.control().expire_queue_tokens();
    assert_eq!(first.get(&http, 0).await.status, StatusCode::UNAUTHORIZED);
    let refreshed = admin
        .call(
            &http,
            Method::PATCH,
            &format!("runtime/runnerscalesets/{set}/sessions/{}", first.id),
            None,
        )
        .await;
    assert_eq!(refreshed.status, StatusCode::OK);
    let token = refreshed.json["messageQueueAccessToken"].as_str().unwrap();
    assert_ne!(token, first.token);
    let renewed = Session {
        token: token.to_owned(),
        ..first
    };
    assert_eq!(renewed.get(&http, 0).await.status, StatusCode::ACCEPTED);

    let deleted = admin
        .call(
            &http,
            Method::DELETE,
            &format!("runtime/runnerscalesets/{set}/sessions/{}", renewed.id),
            None,
        )
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    assert!(!fake.control().has_session(set));
    assert_eq!(renewed.get(&http, 0).await.status, StatusCode::UNAUTHORIZED);
    // The set is free for a new listener.
    let third = session(&http, &admin, set).await;

    // Dropped by the service: the queue refuses, a refresh says expired.
    assert!(fake.control().drop_session(set));
    assert_eq!(third.get(&http, 0).await.status, StatusCode::UNAUTHORIZED);
    let expired = admin
        .call(
            &http,
            Method::PATCH,
            &format!("runtime/runnerscalesets/{set}/sessions/{}", third.id),
            None,
        )
        .await;
    assert_eq!(expired.status, StatusCode::BAD_REQUEST);
    assert!(
        expired
            .type_name()
            .contains("RunnerScaleSetSessionExpiredException")
    );
    session(&http, &admin, set).await;
}

#[tokio::test]
async fn a_dropped_session_ends_a_poll_in_flight() {
    let fake = start(FakeConfig {
        long_poll: Duration::from_secs(20),
        ..FakeConfig::default()
    })
    .await;
    let http = http();
    let admin = register(&http, &fake, "org").await;
    let set = scale_set(&http, &admin, "set", &[]).await;
    let session = session(&http, &admin, set).await;
    let poll = {
        let (http, url, bearer) = (http.clone(), session.queue_url.clone(), session.bearer());
        tokio::spawn(async move { call(&http, Method::GET, &url, Some(&bearer), None).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    fake.control().drop_session(set);
    let answer = tokio::time::timeout(Duration::from_secs(10), poll)
        .await
        .expect("the poll ends before its 20 s wait")
        .unwrap();
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn admin_tokens_expire_by_time_and_on_demand() {
    let fake = start(FakeConfig {
        admin_token_lifetime: Duration::from_secs(1),
        ..FakeConfig::default()
    })
    .await;
    let http = http();
    let admin = register(&http, &fake, "org").await;
    let claims = jwt_claims(&admin.token);
    assert_eq!(
        claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
        1
    );
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let late = admin
        .call(
            &http,
            Method::GET,
            "runtime/runnergroups/?groupName=Default",
            None,
        )
        .await;
    assert_eq!(late.status, StatusCode::UNAUTHORIZED);
    assert!(late.type_name().contains("TokenExpired"));

    let fake = fake_actions::FakeActions::start(FakeConfig::default())
        .await
        .unwrap();
    let admin = register(&http, &fake, "org").await;
    fake.control().expire_admin_tokens();
    let expired = admin
        .call(
            &http,
            Method::GET,
            "runtime/runnergroups/?groupName=Default",
            None,
        )
        .await;
    assert_eq!(expired.status, StatusCode::UNAUTHORIZED);
    // Registering again gives a working token.
    let renewed = register(&http, &fake, "org").await;
    let ok = renewed
        .call(
            &http,
            Method::GET,
            "runtime/runnergroups/?groupName=Default",
            None,
        )
        .await;
    assert_eq!(ok.status, StatusCode::OK);
    // A token for one tenant is refused on another tenant's paths.
    let other = register(&http, &fake, "other").await;
    let crossed = call(
        &http,
        Method::GET,
        &other.url("runtime/runnergroups/?groupName=Default"),
        Some(&renewed.bearer()),
        None,
    )
    .await;
    assert_eq!(crossed.status, StatusCode::UNAUTHORIZED);
    let garbage = call(
        &http,
        Method::GET,
        &renewed.url("runtime/runnergroups/?groupName=Default"),
        Some("Bearer not.a.jwt"),
        None,
    )
    .await;
    assert_eq!(garbage.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn injected_faults_hit_the_next_calls_and_are_counted() {
    let fake = fake().await;
    let http = http();
    let admin = register(&http, &fake, "org").await;
    let control = fake.control();
    let path = "runtime/runnergroups/?groupName=Default";

    control.inject(Fault::new(
        Endpoint::GetRunnerGroupByName,
        FaultKind::status(500),
        2,
    ));
    assert_eq!(
        admin.call(&http, Method::GET, path, None).await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(
        admin.call(&http, Method::GET, path, None).await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(
        admin.call(&http, Method::GET, path, None).await.status,
        StatusCode::OK
    );

    control.inject(Fault::new(
        Endpoint::GetRunnerGroupByName,
        FaultKind::rate_limited(Some(7)),
        1,
    ));
    let limited = admin.call(&http, Method::GET, path, None).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.headers["retry-after"], "7");

    control.inject(Fault::new(
        Endpoint::GetRunnerGroupByName,
        FaultKind::delay(Duration::from_millis(200)),
        1,
    ));
    let started = Instant::now();
    assert_eq!(
        admin.call(&http, Method::GET, path, None).await.status,
        StatusCode::OK
    );
    assert!(started.elapsed() >= Duration::from_millis(200));

    control.inject(Fault::new(
        Endpoint::GetRunnerGroupByName,
        FaultKind::Reset,
        1,
    ));
    let reset = http
        .get(admin.url(path))
        .header("Authorization", admin.bearer())
        .send()
        .await;
    assert!(
        reset.is_err(),
        "the connection is closed without an answer: {reset:?}"
    );
    assert_eq!(
        admin.call(&http, Method::GET, path, None).await.status,
        StatusCode::OK
    );

    // A faulted call has no effect: the runner is not created.
    let set = scale_set(&http, &admin, "set", &[]).await;
    control.inject(Fault::new(
        Endpoint::GenerateJitConfig,
        FaultKind::status(503),
        1,
    ));
    let failed = admin
        .call(
            &http,
            Method::POST,
            &format!("runtime/runnerscalesets/{set}/generatejitconfig"),
            Some(json!({"name": "r"})),
        )
        .await;
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(control.ledger().runners_created, 0);

    // A truncated answer and a late one spoil only the answer: the runner
    // is registered although the client never reads its id.
    let jit = admin.url(&format!("runtime/runnerscalesets/{set}/generatejitconfig"));
    control.inject(Fault::new(
        Endpoint::GenerateJitConfig,
        FaultKind::Truncate,
        1,
    ));
    // The headers may or may not have left before the connection closes;
    // what never arrives is the whole answer.
    let cut = http
        .post(&jit)
        .header("Authorization", admin.bearer())
        .json(&json!({"name": "cut"}))
        .send()
        .await;
    if let Ok(answer) = cut {
        assert_eq!(answer.status(), StatusCode::OK);
        let body = answer.bytes().await;
        assert!(body.is_err(), "the body is cut short: {body:?}");
    }
    assert_eq!(control.ledger().runners_created, 1);

    // A bodiless answer cut short is no answer at all, the work done.
    let cut_id = control.runners()[0].id;
    control.inject(Fault::new(Endpoint::RemoveRunner, FaultKind::Truncate, 1));
    let removal = http
        .delete(admin.url(&format!("distributedtask/pools/0/agents/{cut_id}")))
        .header("Authorization", admin.bearer())
        .send()
        .await;
    assert!(removal.is_err(), "no answer arrives: {removal:?}");
    assert_eq!(control.ledger().removed_by_api, 1, "the removal was done");
    assert_eq!(control.counters().faults(Endpoint::RemoveRunner), 1);

    control.inject(Fault::new(
        Endpoint::GenerateJitConfig,
        FaultKind::late_answer(Duration::from_secs(20)),
        1,
    ));
    let late = http
        .post(&jit)
        .header("Authorization", admin.bearer())
        .json(&json!({"name": "late"}))
        .timeout(Duration::from_secs(2))
        .send()
        .await;
    assert!(
        late.is_err_and(|e| e.is_timeout()),
        "the answer comes too late"
    );
    control
        .wait_until(Duration::from_secs(30), |s| s.ledger.runners_created == 2)
        .await
        .expect("the late call registered its runner");

    let counters = control.counters();
    assert_eq!(counters.calls(Endpoint::GetRunnerGroupByName), 7);
    assert_eq!(counters.faults(Endpoint::GetRunnerGroupByName), 5);
    assert_eq!(counters.calls(Endpoint::RunnerRegistration), 1);
    assert_eq!(counters.calls(Endpoint::GenerateJitConfig), 3);
    assert_eq!(counters.faults(Endpoint::GenerateJitConfig), 3);
}

#[tokio::test]
async fn a_bom_prefixes_service_bodies_when_configured() {
    let fake = start(FakeConfig {
        utf8_bom: true,
        ..FakeConfig::default()
    })
    .await;
    let http = http();
    let admin = register(&http, &fake, "org").await;
    let groups = admin
        .call(
            &http,
            Method::GET,
            "runtime/runnergroups/?groupName=Default",
            None,
        )
        .await;
    assert!(
        groups.raw.starts_with(b"\xEF\xBB\xBF"),
        "{:?}",
        &groups.raw[..8]
    );
    assert_eq!(groups.json["count"], 1);
    // The GitHub API side has none (its token answer parsed fine in register).
    let token = call(
        &http,
        Method::POST,
        &format!(
            "{}/api/v3/orgs/org/actions/runners/registration-token",
            fake.url()
        ),
        Some(&format!("Bearer {}", fake.pat())),
        None,
    )
    .await;
    assert!(token.raw.starts_with(b"{"));
}

#[tokio::test]
async fn the_control_api_works_over_http() {
    let fake = fake().await;
    let http = http();
    let url = |p: &str| format!("{}/_fake/{p}", fake.url());

    let enqueued = call(
        &http,
        Method::POST,
        &url("jobs"),
        None,
        Some(json!({"count": 2, "labels": ["x"], "duration_ms": 5, "outcome": "cancelled"})),
    )
    .await;
    assert_eq!(enqueued.json["ids"].as_array().unwrap().len(), 2);
    let jobs = call(&http, Method::GET, &url("jobs"), None, None).await;
    assert_eq!(jobs.json[0]["phase"], "queued");
    assert_eq!(fake.control().jobs()[0].phase, JobPhase::Queued);

    let fault = call(
        &http,
        Method::POST,
        &url("faults"),
        None,
        Some(json!({"endpoint": "runner-registration", "kind": {"type": "status", "status": 502}, "times": 1})),
    )
    .await;
    assert_eq!(fault.status, StatusCode::NO_CONTENT);
    let registration = call(
        &http,
        Method::POST,
        &format!("{}/api/v3/actions/runner-registration", fake.url()),
        Some("RemoteAuth x"),
        Some(json!({"url": fake.org_url("o")})),
    )
    .await;
    assert_eq!(registration.status, StatusCode::BAD_GATEWAY);
    let bad = call(
        &http,
        Method::POST,
        &url("faults"),
        None,
        Some(json!({"endpoint": "no-such", "kind": {"type": "reset"}, "times": 1})),
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);

    let counters = call(&http, Method::GET, &url("counters"), None, None).await;
    assert_eq!(counters.json["runner-registration"]["calls"], 1);
    assert_eq!(counters.json["runner-registration"]["faults"], 1);
    let ledger = call(&http, Method::GET, &url("ledger"), None, None).await;
    assert_eq!(ledger.json["jobs_enqueued"], 2);
    assert_eq!(ledger.json["jobs_unfinished"], 2);

    for kind in ["admin", "queue", "github"] {
        let expired = call(
            &http,
            Method::POST,
            &url(&format!("tokens/{kind}/expire")),
            None,
            None,
        )
        .await;
        assert_eq!(expired.status, StatusCode::NO_CONTENT);
    }
    let no_session = call(&http, Method::POST, &url("sessions/5/drop"), None, None).await;
    assert_eq!(no_session.status, StatusCode::NOT_FOUND);
    let scale_sets = call(&http, Method::GET, &url("scale-sets"), None, None).await;
    assert_eq!(scale_sets.json, json!([]));
    let settings = call(&http, Method::GET, &url("settings"), None, None).await;
    assert_eq!(settings.json, json!({"assignment_timeout_ms": 60_000}));
    let credentials = call(&http, Method::GET, &url("credentials"), None, None).await;
    assert_eq!(credentials.json["pat"], fake.pat());
    assert!(
        credentials.json["private_key_pem"]
            .as_str()
            .unwrap()
            .contains("PRIVATE KEY")
    );
}

#[tokio::test]
async fn bad_input_gets_a_clear_error_and_the_fake_keeps_serving() {
    let fake = start(FakeConfig {
        long_poll: Duration::from_millis(100),
        ..FakeConfig::default()
    })
    .await;
    let http = http();
    let admin = register(&http, &fake, "org").await;
    let set = scale_set(&http, &admin, "set", &[]).await;

    let response = http
        .post(admin.url("runtime/runnerscalesets"))
        .header("Authorization", admin.bearer())
        .header("Content-Type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: serde_json::Value = response.json().await.unwrap();
    assert!(
        body["typeName"]
            .as_str()
            .unwrap()
            .contains("ArgumentException")
    );

    let nameless = admin
        .call(
            &http,
            Method::POST,
            "runtime/runnerscalesets",
            Some(json!({})),
        )
        .await;
    assert_eq!(nameless.status, StatusCode::BAD_REQUEST);

    let garbage = runner(&http, &fake, "connect", "%%%").await;
    assert_eq!(garbage.status, StatusCode::BAD_REQUEST);
    assert!(garbage.json["message"].as_str().unwrap().contains("base64"));

    let session = session(&http, &admin, set).await;
    let far = session.get(&http, u64::MAX).await;
    assert_eq!(far.status, StatusCode::ACCEPTED);
    let not_a_number = call(
        &http,
        Method::GET,
        &format!("{}?lastMessageId=abc", session.queue_url),
        Some(&session.bearer()),
        None,
    )
    .await;
    assert_eq!(not_a_number.status, StatusCode::BAD_REQUEST);

    let missing_auth = call(
        &http,
        Method::GET,
        &admin.url("runtime/runnergroups/?groupName=Default"),
        None,
        None,
    )
    .await;
    assert_eq!(missing_auth.status, StatusCode::UNAUTHORIZED);
    // Still serving.
    let groups = admin
        .call(
            &http,
            Method::GET,
            "runtime/runnergroups/?groupName=Default",
            None,
        )
        .await;
    assert_eq!(groups.status, StatusCode::OK);
}
