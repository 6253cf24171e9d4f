//! Changing a hold from outside, against the real API server: the Slack
//! interactivity endpoint (signed presses of Extend and Release write the
//! runner's hold annotation within the cap; unsigned, wrongly signed and
//! replayed ones are refused and change nothing) and the hold API (a
//! bearer token reviewed by the API server, and access to update the
//! runner reviewed too).

mod common;

use std::time::Duration;

use arcwright::actions::Secret;
use arcwright::api::{DebugSpec, EphemeralRunner, EphemeralRunnerSpec, SecretKeyRef, SlackSpec};
use arcwright::debug::HOLD_UNTIL_ANNOTATION;
use arcwright::debug::hold::format_hold_until;
use arcwright::slack::message::{EXTEND, RELEASE};
use arcwright::slack::{InteractionsConfig, interactions, router};
use arcwright_harness::TestEnv;
use fake_slack::Interaction;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const SIGNING_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
/// Where the holds of these tests were told to Slack.
const CHANNEL_ID: &str = "CCI-FAILURES";
const MESSAGE_TS: &str = "1700000000.000001";

struct World {
    env: TestEnv,
    url: String,
    base: String,
    _server: tokio::task::JoinHandle<()>,
}

impl World {
    async fn new(name: &str) -> World {
        let env = TestEnv::new(name).await;
        common::install_crds(env.client()).await;
        let (base, server) = serve(env.client()).await;
        let url = format!("{base}{}", interactions::PATH);
        World {
            env,
            url,
            base,
            _server: server,
        }
    }

    /// Another replica's endpoint on the same cluster: its own process
    /// state, the same API server. Returns its interactions URL.
    async fn replica(&self) -> (String, tokio::task::JoinHandle<()>) {
        let (base, server) = serve(self.env.client()).await;
        (format!("{base}{}", interactions::PATH), server)
    }

    fn runners(&self) -> Api<EphemeralRunner> {
        Api::namespaced(self.env.client(), self.env.namespace())
    }

    /// A runner held since `since`, 10 minutes by default, up to an hour,
    /// whose hold was told to Slack in the message [`MESSAGE_TS`] of
    /// [`CHANNEL_ID`].
    async fn held_runner(&self, name: &str, phase: &str, since: Timestamp) {
        self.runner(name, phase, since, true).await;
    }

    /// [`World::held_runner`]; without `tells_slack`, of a scale set with no
    /// Slack configured, and no message posted.
    async fn runner(&self, name: &str, phase: &str, since: Timestamp, tells_slack: bool) {
        let spec = EphemeralRunnerSpec {
            github_config_url: "https://github.com/octo".into(),
            github_config_secret: "github-auth".into(),
            debug: Some(DebugSpec {
                hold_failed_for: Some("10m".into()),
                max_hold: Some("1h".into()),
                slack: tells_slack.then(|| SlackSpec {
                    channel: "#ci-failures".into(),
                    token_secret_ref: SecretKeyRef {
                        name: "slack-bot".into(),
                        key: Some("token".into()),
                    },
                }),
                ..DebugSpec::default()
            }),
            spec: PodSpec {
                containers: vec![Container {
                    name: "runner".into(),
                    ..Container::default()
                }],
                ..PodSpec::default()
            },
            ..EphemeralRunnerSpec::default()
        };
        self.runners()
            .create(&PostParams::default(), &EphemeralRunner::new(name, spec))
            .await
            .unwrap();
        self.runners()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {
                    "phase": phase,
                    "heldSince": Time(since),
                    "holdUntil": Time(since + SignedDuration::from_mins(10)),
                    "slackMessage": tells_slack.then(|| json!({"channel": CHANNEL_ID, "ts": MESSAGE_TS})),
                }})),
            )
            .await
            .unwrap();
    }

    async fn hold_until(&self, name: &str) -> Option<String> {
        self.runners()
            .get(name)
            .await
            .unwrap()
            .annotations()
            .get(HOLD_UNTIL_ANNOTATION)
            .cloned()
    }

    /// A press of `action` on `name` from the message its hold was told in.
    fn press(&self, action: &str, name: &str) -> Interaction {
        Interaction::press(
            action,
            &format!("{}/{name}", self.env.namespace()),
            SIGNING_SECRET,
        )
        .in_message(CHANNEL_ID, MESSAGE_TS)
    }
}

fn whole_seconds_ago(secs: i64) -> Timestamp {
    Timestamp::from_second(Timestamp::now().as_second() - secs).unwrap()
}

#[tokio::test]
async fn a_signed_extend_moves_the_hold_up_to_its_cap() {
    let world = World::new("slack-extend").await;
    let since = whole_seconds_ago(60);
    world.held_runner("r", "Debugging", since).await;

    let status = world.press(EXTEND, "r").send(&world.url).await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        world.hold_until("r").await,
        Some(format_hold_until(since + SignedDuration::from_mins(40))),
        "the default end (10m after the job) plus 30m"
    );
    let status = world.press(EXTEND, "r").send(&world.url).await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        world.hold_until("r").await,
        Some(format_hold_until(since + SignedDuration::from_mins(60))),
        "capped by maxHold"
    );
}

#[tokio::test]
async fn a_signed_release_ends_the_hold_now() {
    let world = World::new("slack-release").await;
    world
        .held_runner("r", "Debugging", whole_seconds_ago(60))
        .await;
    let before = whole_seconds_ago(1);
    let status = world.press(RELEASE, "r").send(&world.url).await.unwrap();
    let after = Timestamp::now() + SignedDuration::from_secs(1);
    assert_eq!(status, 200);
    let until: Timestamp = world.hold_until("r").await.unwrap().parse().unwrap();
    assert!(
        before <= until && until <= after,
        "{before} <= {until} <= {after}"
    );
}

#[tokio::test]
async fn unsigned_wrongly_signed_and_replayed_presses_change_nothing() {
    let world = World::new("slack-refused").await;
    world
        .held_runner("r", "Debugging", whole_seconds_ago(60))
        .await;
    let refused = [
        ("unsigned", world.press(EXTEND, "r").unsigned()),
        (
            "another secret",
            world.press(EXTEND, "r").signed_with("not-the-secret"),
        ),
        (
            "six minutes old",
            world.press(EXTEND, "r").aged(Duration::from_secs(6 * 60)),
        ),
        ("release, unsigned", world.press(RELEASE, "r").unsigned()),
    ];
    for (name, press) in refused {
        let status = press.send(&world.url).await.unwrap();
        assert_eq!(status, 401, "{name}");
        assert_eq!(world.hold_until("r").await, None, "{name} changed nothing");
    }
    // A body changed after signing is refused too.
    let mut tampered = world.press(EXTEND, "r");
    let signed = tampered.clone();
    tampered.payload["actions"][0]["value"] = json!("kube-system/other");
    let status = send_with_signature_of(&tampered, &signed, &world.url).await;
    assert_eq!(status, 401);
    assert_eq!(world.hold_until("r").await, None);
    // The same press, signed, goes through: the refusals were the signature's.
    assert_eq!(
        world.press(EXTEND, "r").send(&world.url).await.unwrap(),
        200
    );
    assert!(world.hold_until("r").await.is_some());
}

#[tokio::test]
async fn a_runner_not_held_is_not_held_by_a_press() {
    let world = World::new("slack-not-held").await;
    world
        .held_runner("r", "Running", whole_seconds_ago(60))
        .await;
    let status = world.press(EXTEND, "r").send(&world.url).await.unwrap();
    assert_eq!(status, 409);
    assert_eq!(world.hold_until("r").await, None);
    let status = world
        .press(EXTEND, "absent")
        .send(&world.url)
        .await
        .unwrap();
    assert_eq!(status, 409);
}

#[tokio::test]
async fn a_press_acts_only_from_the_message_posted_about_the_hold() {
    let world = World::new("slack-bound").await;
    world
        .held_runner("r", "Debugging", whole_seconds_ago(60))
        .await;
    world
        .runner("quiet", "Debugging", whole_seconds_ago(60), false)
        .await;
    let refused = [
        (
            "a button crafted in another message",
            world
                .press(EXTEND, "r")
                .in_message(CHANNEL_ID, "1700000000.999999"),
        ),
        (
            "the same timestamp in another channel",
            world.press(EXTEND, "r").in_message("COTHER", MESSAGE_TS),
        ),
        (
            "a runner whose scale set never tells Slack",
            world.press(EXTEND, "quiet"),
        ),
        (
            "no message at all",
            Interaction::press(
                EXTEND,
                &format!("{}/r", world.env.namespace()),
                SIGNING_SECRET,
            ),
        ),
    ];
    for (name, press) in refused {
        assert_eq!(press.send(&world.url).await.unwrap(), 403, "{name}");
    }
    assert_eq!(world.hold_until("r").await, None, "nothing changed");
    assert_eq!(world.hold_until("quiet").await, None, "nothing changed");
}

#[tokio::test]
async fn a_press_is_taken_once_however_often_it_is_sent() {
    let world = World::new("slack-replay").await;
    let since = whole_seconds_ago(60);
    world.held_runner("r", "Debugging", since).await;
    let press = world.press(EXTEND, "r");
    assert_eq!(press.send(&world.url).await.unwrap(), 200);
    let once = Some(format_hold_until(since + SignedDuration::from_mins(40)));
    assert_eq!(world.hold_until("r").await, once);
    // The same signed request again, as a replay within the signature's
    // window: answered, and nothing moves.
    assert_eq!(press.send(&world.url).await.unwrap(), 200);
    assert_eq!(world.hold_until("r").await, once, "extended once only");
    // And to another replica behind the same Service, which never saw it:
    // the press is recorded on the runner, so it is taken there too.
    let (other, _replica) = world.replica().await;
    assert_eq!(press.send(&other).await.unwrap(), 200);
    assert_eq!(
        world.hold_until("r").await,
        once,
        "extended once, by any replica"
    );
    // A second press of the button is a request of its own.
    assert_eq!(
        world.press(EXTEND, "r").send(&world.url).await.unwrap(),
        200
    );
    assert_eq!(
        world.hold_until("r").await,
        Some(format_hold_until(since + SignedDuration::from_mins(60)))
    );
    // One press reaching both replicas at once (Slack's retry while the
    // first is answered): one write wins the runner's resourceVersion, the
    // other reads again and finds the press taken.
    world.held_runner("s", "Debugging", since).await;
    let press = world.press(EXTEND, "s");
    let (a, b) = tokio::join!(press.send(&world.url), press.send(&other));
    assert_eq!((a.unwrap(), b.unwrap()), (200, 200));
    assert_eq!(
        world.hold_until("s").await,
        Some(format_hold_until(since + SignedDuration::from_mins(40))),
        "extended once"
    );
}

/// Serves the interactions endpoint and the hold API as one replica of the
/// host does; returns its base URL and its task.
async fn serve(client: kube::Client) -> (String, tokio::task::JoinHandle<()>) {
    let app = router(
        client.clone(),
        InteractionsConfig {
            signing_secret: Secret::new(SIGNING_SECRET),
            extend_by: Duration::from_secs(30 * 60),
        },
    )
    .merge(arcwright::debug::api::router(client));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let app = app.into_make_service_with_connect_info::<arcwright::debug::api::ClientAddr>();
        axum::serve(listener, app).await.unwrap();
    });
    (base, server)
}

/// Sends `body`'s payload with the signature headers made for `signed`'s.
async fn send_with_signature_of(body: &Interaction, signed: &Interaction, url: &str) -> u16 {
    let encode = |i: &Interaction| {
        url::form_urlencoded::Serializer::new(String::new())
            .append_pair("payload", &i.payload.to_string())
            .finish()
    };
    let signature = fake_slack::sign(SIGNING_SECRET, signed.timestamp, &encode(signed));
    reqwest::Client::new()
        .post(url)
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-slack-request-timestamp", signed.timestamp.to_string())
        .header("x-slack-signature", signature)
        .body(encode(body))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// A ServiceAccount in the test namespace and a token for it; with `allowed`,
/// a Role letting it update EphemeralRunners there.
async fn service_account(world: &World, name: &str, allowed: bool) -> String {
    let rules = if allowed {
        json!([{"apiGroups": ["arcwright.dev"], "resources": ["ephemeralrunners"], "verbs": ["get", "update"]}])
    } else {
        json!([])
    };
    common::service_account_with_rules(world.env.client(), world.env.namespace(), name, rules).await
}

/// Calls the hold API; returns the status and the JSON answer.
async fn call_hold_api(
    world: &World,
    method: reqwest::Method,
    name: &str,
    token: Option<&str>,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let url = format!(
        "{}/api/v1/namespaces/{}/ephemeralrunners/{name}/hold",
        world.base,
        world.env.namespace()
    );
    let mut request = reqwest::Client::new().request(method, url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or_default())
}

#[tokio::test]
async fn a_burst_of_made_up_tokens_costs_a_bounded_number_of_token_reviews() {
    let world = World::new("hold-api-burst").await;
    world
        .held_runner("r", "Debugging", whole_seconds_ago(60))
        .await;
    let throttle = arcwright::debug::api::Throttle::default();
    let started = std::time::Instant::now();
    let mut reviewed = 0u64;
    let mut refused = 0u64;
    for i in 0..100 {
        let token = format!("made-up-{i}-{:016x}", rand::random::<u64>());
        let (status, answer) = call_hold_api(
            &world,
            reqwest::Method::POST,
            "r",
            Some(&token),
            Some(json!({"duration": "30m"})),
        )
        .await;
        match status {
            // Reviewed, and found not to be a token.
            401 => reviewed += 1,
            429 => refused += 1,
            other => panic!("{other}: {answer}"),
        }
    }
    // Every answer but a 429 cost one TokenReview; the budget allows the
    // burst and one more per refill the run took.
    let grown = started.elapsed().as_secs() / throttle.refill().as_secs() + 1;
    assert!(
        reviewed <= u64::from(throttle.burst()) + grown,
        "{reviewed} tokens reviewed, {refused} refused"
    );
    assert!(refused >= 100 - u64::from(throttle.burst()) - grown);
    assert_eq!(world.hold_until("r").await, None, "nothing changed");
}

#[tokio::test]
async fn the_hold_api_extends_and_releases_for_those_allowed_to_update_the_runner() {
    let world = World::new("hold-api").await;
    let since = whole_seconds_ago(60);
    world.held_runner("r", "Debugging", since).await;
    let holder = service_account(&world, "holder", true).await;
    let stranger = service_account(&world, "stranger", false).await;
    // The holder's own account, with a token made for the API server (what
    // a kubeconfig or a pod holds): valid in the cluster, not here.
    let general = common::token_for(world.env.client(), world.env.namespace(), "holder", &[]).await;
    let extend = || Some(json!({"duration": "30m"}));

    // Refused: no token, a token the API server does not know, a token not
    // made for arcwright, a user who may not update the runner. None of
    // them changes the hold.
    let refused = [
        ("no token", None, 401),
        ("a made-up token", Some("not-a-token"), 401),
        ("a token for the API server", Some(general.as_str()), 401),
        ("not allowed", Some(stranger.as_str()), 403),
    ];
    for (name, token, want) in refused {
        let (status, answer) =
            call_hold_api(&world, reqwest::Method::POST, "r", token, extend()).await;
        assert_eq!(status, want, "{name}: {answer}");
        assert_eq!(world.hold_until("r").await, None, "{name} changed nothing");
    }
    let (status, answer) =
        call_hold_api(&world, reqwest::Method::DELETE, "r", Some(&stranger), None).await;
    assert_eq!(status, 403, "{answer}");
    assert!(
        answer["message"].as_str().unwrap().contains("stranger"),
        "{answer}"
    );

    // Allowed: extended by 30m from the default end, then capped.
    let (status, answer) =
        call_hold_api(&world, reqwest::Method::POST, "r", Some(&holder), extend()).await;
    assert_eq!(status, 200, "{answer}");
    let extended = format_hold_until(since + SignedDuration::from_mins(40));
    assert_eq!(answer["holdUntil"], extended.as_str());
    assert_eq!(world.hold_until("r").await, Some(extended));
    let five_hours = Some(json!({"duration": "5h"}));
    let (status, answer) = call_hold_api(
        &world,
        reqwest::Method::POST,
        "r",
        Some(&holder),
        five_hours,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let capped = format_hold_until(since + SignedDuration::from_mins(60));
    assert_eq!(world.hold_until("r").await, Some(capped));

    // Bad input is refused with a reason.
    let vague = Some(json!({"duration": "a while"}));
    let (status, answer) =
        call_hold_api(&world, reqwest::Method::POST, "r", Some(&holder), vague).await;
    assert_eq!(status, 400);
    assert!(
        answer["message"].as_str().unwrap().contains("30m"),
        "{answer}"
    );
    let (status, _) = call_hold_api(
        &world,
        reqwest::Method::POST,
        "absent",
        Some(&holder),
        extend(),
    )
    .await;
    assert_eq!(status, 404);

    // Released now.
    let before = whole_seconds_ago(1);
    let (status, answer) =
        call_hold_api(&world, reqwest::Method::DELETE, "r", Some(&holder), None).await;
    assert_eq!(status, 200, "{answer}");
    let until: Timestamp = world.hold_until("r").await.unwrap().parse().unwrap();
    assert!(before <= until && until <= Timestamp::now() + SignedDuration::from_secs(1));
}
