//! Credentials from Secrets on the real API server, clients against the fake
//! Actions service, and the production remover against the fake's ledger.

use std::collections::BTreeMap;
use std::time::Duration;

use arcwright::actions::{
    ActionsClient, ClientOptions, JitConfig, JitRunnerSetting, RetryPolicy, RunnerScaleSet,
};
use arcwright::credentials::{
    ActionsClients, ActionsRemover, CredentialsError, GitHubTarget, ProxyTarget,
};
use arcwright::unregistration::{
    PoolConfig, Removal, Remover, UnregistrationKey, UnregistrationPool,
};
use arcwright_harness::TestEnv;
use fake_actions::{Endpoint, FakeActions, FakeConfig, JobSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

fn fast_options() -> ClientOptions {
    ClientOptions {
        timeout: Duration::from_secs(5),
        retry: RetryPolicy {
            max_retries: 2,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(40),
            max_retry_after: Duration::from_secs(1),
        },
        allow_plain_http: true,
        ..ClientOptions::default()
    }
}

fn secret<K: ToString, V: ToString>(name: &str, pairs: impl IntoIterator<Item = (K, V)>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        string_data: Some(
            pairs
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..Secret::default()
    }
}

fn pat_secret(fake: &FakeActions) -> Secret {
    secret("github", [("github_token", fake.pat())])
}

fn app_pairs(fake: &FakeActions) -> Vec<(String, String)> {
    let app = fake.app_credentials();
    vec![
        ("github_app_id".into(), app.app_id.to_string()),
        (
            "github_app_installation_id".into(),
            app.installation_id.to_string(),
        ),
        ("github_app_private_key".into(), app.private_key_pem),
    ]
}

fn app_secret(fake: &FakeActions) -> Secret {
    secret("github", app_pairs(fake))
}

fn target(env: &TestEnv, fake: &FakeActions, secret_name: &str) -> GitHubTarget {
    GitHubTarget {
        namespace: env.namespace().to_string(),
        config_url: fake.org_url("octo-org"),
        secret_name: secret_name.to_string(),
        proxy: None,
        ca_config_map: None,
    }
}

async fn create(env: &TestEnv, secret: &Secret) {
    Api::<Secret>::namespaced(env.client(), env.namespace())
        .create(&PostParams::default(), secret)
        .await
        .expect("secret created");
}

async fn replace(env: &TestEnv, secret: &Secret) {
    let api = Api::<Secret>::namespaced(env.client(), env.namespace());
    let name = secret.metadata.name.as_deref().unwrap();
    let mut current = api.get(name).await.expect("secret exists");
    current.data = None;
    current.string_data = secret.string_data.clone();
    api.replace(name, &PostParams::default(), &current)
        .await
        .expect("secret replaced");
}

fn calls(fake: &FakeActions, endpoint: Endpoint) -> u64 {
    fake.control().counters().calls(endpoint)
}

/// A namespace of its own, a fake service, a client cache, and (when
/// `github` is given) the Secret `github` it builds from the fake's
/// credentials.
async fn setup(
    name: &str,
    github: Option<fn(&FakeActions) -> Secret>,
) -> (TestEnv, FakeActions, ActionsClients) {
    let env = TestEnv::new(name).await;
    let fake = FakeActions::start(FakeConfig::default())
        .await
        .expect("the fake starts");
    if let Some(github) = github {
        create(&env, &github(&fake)).await;
    }
    let clients = ActionsClients::new(env.client(), fast_options());
    (env, fake, clients)
}

/// Proves the client can talk to the service (a bootstrap and a call).
async fn works(client: &ActionsClient) {
    let group = client
        .get_runner_group_by_name("Default")
        .await
        .expect("the client works");
    assert_eq!(group.id, 1);
}

#[tokio::test]
async fn a_pat_secret_gives_a_working_client() {
    let (env, fake, clients) = setup("credentials-pat", Some(pat_secret)).await;
    works(&clients.get(&target(&env, &fake, "github")).await.unwrap()).await;
    assert_eq!(calls(&fake, Endpoint::RegistrationToken), 1);
    assert_eq!(calls(&fake, Endpoint::AppInstallationToken), 0);
}

#[tokio::test]
async fn an_app_secret_gives_a_working_client() {
    let (env, fake, clients) = setup("credentials-app", Some(app_secret)).await;
    works(&clients.get(&target(&env, &fake, "github")).await.unwrap()).await;
    assert_eq!(calls(&fake, Endpoint::AppInstallationToken), 1);
}

#[tokio::test]
async fn every_user_of_a_credential_shares_one_client() {
    let (env, fake, clients) = setup("credentials-shared", Some(pat_secret)).await;
    let target = target(&env, &fake, "github");
    for _ in 0..3 {
        works(&clients.clone().get(&target).await.unwrap()).await;
    }
    // One client, so one bootstrap and one admin token for all three.
    assert_eq!(calls(&fake, Endpoint::RunnerRegistration), 1);
    assert_eq!(clients.cached(), 1);
}

/// Targets are what tenants write: a namespace trying URL after URL keeps
/// at most its limit of clients, and the others still work, built for
/// their one use; a forgotten target makes room.
#[tokio::test]
async fn a_namespace_keeps_at_most_its_limit_of_clients() {
    let (env, fake, _) = setup("credentials-bounded", Some(pat_secret)).await;
    let limits = arcwright::tenant_cache::Limits {
        per_namespace: 2,
        idle: Duration::from_secs(3600),
    };
    let clients = ActionsClients::with_limits(env.client(), fast_options(), limits);
    let targets: Vec<GitHubTarget> = ["org-a", "org-b", "org-c"]
        .into_iter()
        .map(|org| GitHubTarget {
            config_url: fake.org_url(org),
            ..target(&env, &fake, "github")
        })
        .collect();
    for target in &targets {
        works(&clients.get(target).await.unwrap()).await;
    }
    assert_eq!(
        clients.cached(),
        2,
        "the third target's client was not kept"
    );
    // Asked again, the third is built again: a bootstrap of its own.
    let bootstraps = calls(&fake, Endpoint::RunnerRegistration);
    works(&clients.get(&targets[2]).await.unwrap()).await;
    assert_eq!(calls(&fake, Endpoint::RunnerRegistration), bootstraps + 1);
    // A target forgotten (its scale set deleted) makes room for another.
    clients.forget(&targets[0]);
    works(&clients.get(&targets[2]).await.unwrap()).await;
    assert_eq!(clients.cached(), 2);
    let bootstraps = calls(&fake, Endpoint::RunnerRegistration);
    works(&clients.get(&targets[2]).await.unwrap()).await;
    assert_eq!(
        calls(&fake, Endpoint::RunnerRegistration),
        bootstraps,
        "kept now"
    );
}

#[tokio::test]
async fn a_rotated_secret_gives_a_new_client() {
    let (env, fake, clients) = setup("credentials-rotated", Some(pat_secret)).await;
    let target = target(&env, &fake, "github");
    works(&clients.get(&target).await.unwrap()).await;
    assert_eq!(calls(&fake, Endpoint::AppInstallationToken), 0);

    // Rotated from the PAT to the App: the next client once the last read
    // is no longer fresh must use the App.
    replace(&env, &app_secret(&fake)).await;
    tokio::time::sleep(arcwright::credentials::CREDENTIALS_FRESHNESS).await;
    works(&clients.get(&target).await.unwrap()).await;
    assert_eq!(calls(&fake, Endpoint::AppInstallationToken), 1);
    assert_eq!(calls(&fake, Endpoint::RunnerRegistration), 2);
    assert_eq!(clients.cached(), 1, "the stale client is replaced");
}

#[tokio::test]
async fn unusable_secrets_are_clear_errors_without_values() {
    let (env, fake, clients) = setup("credentials-errors", None).await;
    let ns = env.namespace().to_string();

    let err = clients
        .get(&target(&env, &fake, "absent"))
        .await
        .expect_err("no secret");
    assert!(
        matches!(err, CredentialsError::SecretNotFound { .. }),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        format!("secret {ns}/absent does not exist")
    );

    create(
        &env,
        &secret("unrelated", [("token", "ghp_notTheRightKey")]),
    )
    .await;
    let err = clients
        .get(&target(&env, &fake, "unrelated"))
        .await
        .expect_err("no key");
    assert!(matches!(err, CredentialsError::MissingKey { .. }), "{err}");
    let shown = format!("{err} {err:?}");
    assert!(shown.contains(&format!("secret {ns}/unrelated has no github_token")));
    assert!(!shown.contains("ghp_notTheRightKey"), "{shown}");

    let mut pairs = app_pairs(&fake);
    pairs.retain(|(k, _)| k != "github_app_installation_id");
    create(&env, &secret("half-app", pairs)).await;
    let err = clients
        .get(&target(&env, &fake, "half-app"))
        .await
        .expect_err("no installation id");
    assert!(
        err.to_string()
            .ends_with("half-app has no github_app_installation_id"),
        "{err}"
    );

    let bad_key =
        "-----BEGIN RSA PRIVATE KEY-----\nTm90QUtleUF0QWxs\n-----END RSA PRIVATE KEY-----\n";
    create(
        &env,
        &secret(
            "bad-key",
            [
                ("github_app_id", "424242"),
                ("github_app_installation_id", "4242424"),
                ("github_app_private_key", bad_key),
            ],
        ),
    )
    .await;
    let err = clients
        .get(&target(&env, &fake, "bad-key"))
        .await
        .expect_err("bad key");
    assert!(matches!(err, CredentialsError::Invalid { .. }), "{err}");
    let shown = format!("{err} {err:?}");
    assert!(
        shown.contains(&format!(
            "secret {ns}/bad-key: github_app_private_key is invalid"
        )),
        "{shown}"
    );
    assert!(!shown.contains("Tm90QUtleUF0QWxs"), "{shown}");
    assert_eq!(clients.cached(), 0);
    // Nothing reached the service.
    assert_eq!(calls(&fake, Endpoint::RegistrationToken), 0);
}

/// A scale set and one runner registered in it, as the fake's ledger counts.
async fn register_runner(client: &ActionsClient, set_name: &str) -> (RunnerScaleSet, JitConfig) {
    let set = client
        .create_runner_scale_set(&RunnerScaleSet::new(set_name, 1, &[]))
        .await
        .expect("scale set created");
    let jit = client
        .generate_jit_runner_config(
            set.id,
            &JitRunnerSetting {
                name: format!("{set_name}-runner"),
                work_folder: String::new(),
            },
        )
        .await
        .expect("runner registered");
    (set, jit)
}

#[tokio::test]
async fn the_remover_removes_a_registered_runner() {
    let (env, fake, clients) = setup("remover-registered", Some(pat_secret)).await;
    let target = target(&env, &fake, "github");
    let (_, jit) = register_runner(&clients.get(&target).await.unwrap(), "remove-me").await;
    assert_eq!(fake.control().ledger().still_registered, 1);

    let remover = ActionsRemover::new(clients);
    assert_eq!(
        remover.remove(&target, jit.runner.id).await,
        Removal::Removed
    );
    let ledger = fake.control().ledger();
    assert_eq!((ledger.removed_by_api, ledger.still_registered), (1, 0));
}

#[tokio::test]
async fn the_remover_finds_an_unknown_runner_already_gone() {
    let (env, fake, clients) = setup("remover-unknown", Some(pat_secret)).await;
    let remover = ActionsRemover::new(clients);
    // The service answers a removal of a runner it does not know with
    // success, so "gone" is all that can be said; either way the pod may go.
    let removal = remover
        .remove(&target(&env, &fake, "github"), 987_654)
        .await;
    assert!(removal.registration_gone(), "{removal:?}");
    let ledger = fake.control().ledger();
    assert_eq!(ledger.remove_calls_for_absent_runners, 1);
    assert_eq!(ledger.removed_by_api, 0);
}

#[tokio::test]
async fn the_remover_reports_a_busy_runner_as_job_still_running() {
    let (env, fake, clients) = setup("remover-busy", Some(pat_secret)).await;
    let target = target(&env, &fake, "github");
    let client = clients.get(&target).await.unwrap();
    let (set, jit) = register_runner(&client, "busy-set").await;

    // The runner connects, the listener acquires a long job, the runner
    // takes it: the job is running.
    let runner = |what: &str| {
        reqwest::Client::new()
            .post(format!("{}/_runner/{what}", fake.url()))
            .json(&serde_json::json!({"jitConfig": jit.encoded_jit_config.expose()}))
            .send()
    };
    assert!(runner("connect").await.unwrap().status().is_success());
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
    assert_eq!(runner("job").await.unwrap().status(), 200);

    let remover = ActionsRemover::new(clients);
    assert_eq!(
        remover.remove(&target, jit.runner.id).await,
        Removal::JobStillRunning
    );
    let ledger = fake.control().ledger();
    assert_eq!(ledger.remove_calls_refused_job_running, 1);
    assert_eq!(ledger.still_registered, 1);
}

#[tokio::test]
async fn the_remover_reports_unusable_credentials_as_a_failure() {
    let (env, fake, clients) = setup("remover-no-secret", None).await;
    let remover = ActionsRemover::new(clients);
    let removal = remover.remove(&target(&env, &fake, "absent"), 1).await;
    assert_eq!(
        removal,
        Removal::Failed(format!("secret {}/absent does not exist", env.namespace()))
    );
    assert_eq!(calls(&fake, Endpoint::RemoveRunner), 0);
}

async fn create_config_map(env: &TestEnv, name: &str, key: &str, value: &str) {
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(key.to_string(), value.to_string())])),
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(env.client(), env.namespace())
        .create(&PostParams::default(), &config_map)
        .await
        .expect("configmap created");
}

#[tokio::test]
async fn the_ca_bundle_and_proxy_credentials_are_read_from_their_references() {
    let (env, fake, clients) = setup("credentials-references", Some(pat_secret)).await;
    let ns = env.namespace().to_string();
    let with_ca = |name: &str| GitHubTarget {
        ca_config_map: Some((name.to_string(), "ca.crt".to_string())),
        ..target(&env, &fake, "github")
    };

    let err = clients.get(&with_ca("absent")).await.expect_err("no CA");
    assert_eq!(
        err.to_string(),
        format!("configmap {ns}/absent does not exist")
    );

    create_config_map(&env, "other-key", "tls.crt", "x").await;
    let err = clients
        .get(&with_ca("other-key"))
        .await
        .expect_err("no key");
    assert_eq!(
        err.to_string(),
        format!("configmap {ns}/other-key has no ca.crt")
    );

    create_config_map(&env, "not-pem", "ca.crt", "not a certificate").await;
    let err = clients.get(&with_ca("not-pem")).await.expect_err("bad PEM");
    assert_eq!(err.metric_label(), "client_setup", "{err}");

    let ca = rcgen::generate_simple_self_signed(vec!["ghes.example".to_string()]).unwrap();
    create_config_map(&env, "good-ca", "ca.crt", &ca.cert.pem()).await;
    works(&clients.get(&with_ca("good-ca")).await.unwrap()).await;

    let with_proxy = |secret: &str| GitHubTarget {
        proxy: Some(ProxyTarget {
            https_url: Some("http://proxy.invalid:3128".into()),
            https_credential_secret: Some(secret.to_string()),
            ..ProxyTarget::default()
        }),
        ..target(&env, &fake, "github")
    };
    let err = clients
        .get(&with_proxy("no-proxy-secret"))
        .await
        .expect_err("no proxy secret");
    assert_eq!(
        err.to_string(),
        format!("secret {ns}/no-proxy-secret does not exist")
    );
    create(&env, &secret("proxy-no-user", [("password", "hunter2")])).await;
    let err = clients
        .get(&with_proxy("proxy-no-user"))
        .await
        .expect_err("no user name");
    let shown = format!("{err} {err:?}");
    assert!(
        shown.contains(&format!("secret {ns}/proxy-no-user has no username")),
        "{shown}"
    );
    assert!(!shown.contains("hunter2"), "{shown}");
    create(
        &env,
        &secret("proxy-user", [("username", "u"), ("password", "hunter2")]),
    )
    .await;
    // The fake is reached directly (no_proxy would say so for a real
    // host; here the proxy is only for https and the fake speaks http).
    works(&clients.get(&with_proxy("proxy-user")).await.unwrap()).await;
}

#[tokio::test]
async fn the_pool_removes_registrations_through_the_service_and_reports_them() {
    let (env, fake, clients) = setup("remover-pool", Some(pat_secret)).await;
    let target = target(&env, &fake, "github");
    let (_, jit) = register_runner(&clients.get(&target).await.unwrap(), "pooled").await;

    let (tx, mut finished) = tokio::sync::mpsc::unbounded_channel();
    let pool = UnregistrationPool::new(
        ActionsRemover::new(clients),
        PoolConfig::default(),
        move |done| {
            let _ = tx.send(done);
        },
    );
    let shutdown = tokio_util::sync::CancellationToken::new();
    tokio::spawn(pool.clone().run(shutdown.clone()));
    let key = UnregistrationKey {
        namespace: env.namespace().to_string(),
        name: "pooled-runner".into(),
        runner_id: jit.runner.id,
    };
    assert!(pool.push(key.clone(), target));
    let done = tokio::time::timeout(Duration::from_secs(30), finished.recv())
        .await
        .expect("the removal finished")
        .expect("the pool is running");
    assert_eq!((done.key, done.removal), (key.clone(), Removal::Removed));
    assert_eq!(pool.take_finished(&key), Some(Removal::Removed));
    let ledger = fake.control().ledger();
    assert_eq!((ledger.removed_by_api, ledger.still_registered), (1, 0));
    shutdown.cancel();
}
