//! The API server semantics arcwright depends on, proven against the real
//! server: CRDs become established, `metadata.generation` moves on spec writes
//! and not on status writes, finalizers hold deletion, watches deliver events.
//! And the harness itself: processes and data are gone after a stop, also when
//! the test that owned them panicked.

use std::time::Duration;

use arcwright_harness::{ControlPlane, TestEnv};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::watcher::{self, Event};
use kube::{CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// A minimal namespaced custom resource with a status subresource, standing
/// in for arcwright's own kinds.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "smoke.arcwright.dev",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus"
)]
struct WidgetSpec {
    size: i32,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
struct WidgetStatus {
    observed: i32,
}

/// Installs the Widget CRD (once per control plane) and waits until the
/// server serves it.
async fn install_crd(client: kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    match crds.create(&PostParams::default(), &Widget::crd()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("creating the Widget CRD: {e}"),
    }
    tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(
            crds,
            "widgets.smoke.arcwright.dev",
            conditions::is_crd_established(),
        ),
    )
    .await
    .expect("the CRD is established within 30 s")
    .expect("waiting for the CRD");
}

fn widget(name: &str, size: i32) -> Widget {
    Widget::new(name, WidgetSpec { size })
}

#[tokio::test]
async fn a_crd_becomes_established_and_serves_objects() {
    let env = TestEnv::new("crd-established").await;
    install_crd(env.client()).await;
    let widgets: Api<Widget> = Api::namespaced(env.client(), env.namespace());
    let created = widgets
        .create(&PostParams::default(), &widget("w", 3))
        .await
        .unwrap();
    assert_eq!(created.spec.size, 3);
    assert_eq!(widgets.get("w").await.unwrap().spec.size, 3);
}

#[tokio::test]
async fn spec_writes_bump_generation_and_status_writes_do_not() {
    let env = TestEnv::new("generation").await;
    install_crd(env.client()).await;
    let widgets: Api<Widget> = Api::namespaced(env.client(), env.namespace());
    let created = widgets
        .create(&PostParams::default(), &widget("g", 1))
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));

    let after_status = widgets
        .patch_status(
            "g",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"observed": 1}})),
        )
        .await
        .unwrap();
    assert_eq!(after_status.metadata.generation, Some(1));
    assert_eq!(after_status.status.unwrap().observed, 1);

    let after_spec = widgets
        .patch(
            "g",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 2}})),
        )
        .await
        .unwrap();
    assert_eq!(after_spec.metadata.generation, Some(2));

    // A status write through the main resource is ignored, as the server
    // treats status as a subresource.
    let ignored = widgets
        .patch(
            "g",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"observed": 99}})),
        )
        .await
        .unwrap();
    assert_eq!(ignored.status.unwrap().observed, 1);
    assert_eq!(ignored.metadata.generation, Some(2));
}

#[tokio::test]
async fn a_finalizer_holds_deletion_until_it_is_removed() {
    let env = TestEnv::new("finalizer").await;
    install_crd(env.client()).await;
    let widgets: Api<Widget> = Api::namespaced(env.client(), env.namespace());
    let mut object = widget("f", 1);
    object.metadata.finalizers = Some(vec!["smoke.arcwright.dev/hold".into()]);
    widgets
        .create(&PostParams::default(), &object)
        .await
        .unwrap();

    widgets.delete("f", &DeleteParams::default()).await.unwrap();
    let held = widgets.get("f").await.expect("still there while finalized");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert_eq!(held.finalizers(), ["smoke.arcwright.dev/hold"]);

    // Removing the last finalizer is what lets the server delete it.
    widgets
        .patch(
            "f",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    let gone = widgets.get_opt("f").await.unwrap();
    assert!(gone.is_none(), "the object is deleted once unfinalized");
}

#[tokio::test]
async fn a_watch_sees_creation_update_and_deletion() {
    let env = TestEnv::new("watch").await;
    install_crd(env.client()).await;
    let widgets: Api<Widget> = Api::namespaced(env.client(), env.namespace());
    let mut stream = watcher::watcher(widgets.clone(), watcher::Config::default()).boxed();

    // The initial list is empty and complete before anything is written.
    loop {
        match stream.try_next().await.unwrap().unwrap() {
            Event::InitDone => break,
            Event::Init | Event::InitApply(_) => {}
            other => panic!("unexpected event before InitDone: {other:?}"),
        }
    }

    widgets
        .create(&PostParams::default(), &widget("watched", 1))
        .await
        .unwrap();
    widgets
        .patch(
            "watched",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 5}})),
        )
        .await
        .unwrap();
    widgets
        .delete("watched", &DeleteParams::default())
        .await
        .unwrap();

    let mut sizes = Vec::new();
    let mut deleted = false;
    while !deleted {
        let event = tokio::time::timeout(Duration::from_secs(20), stream.try_next())
            .await
            .expect("an event within 20 s")
            .unwrap()
            .unwrap();
        match event {
            Event::Apply(w) => sizes.push(w.spec.size),
            Event::Delete(w) => {
                assert_eq!(w.name_any(), "watched");
                deleted = true;
            }
            other => panic!("unexpected event: {other:?}"),
        }
    }
    assert_eq!(sizes, [1, 5]);
}

fn alive(pid: u32) -> bool {
    // Signal 0 probes for existence; a reaped child no longer exists.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

#[tokio::test]
async fn stopping_a_control_plane_leaves_no_process_or_data() {
    let plane = ControlPlane::start().await.expect("start");
    eprintln!(
        "control plane started in {:.2} s",
        plane.started_in().as_secs_f64()
    );
    let pids = plane.pids().to_vec();
    let dir = plane.data_dir().to_path_buf();
    assert_eq!(pids.len(), 2);
    assert!(pids.iter().all(|&pid| alive(pid)));
    assert!(dir.join("kubeconfig").is_file());

    // The client works against it.
    let version = plane.client().apiserver_version().await.unwrap();
    assert_eq!(version.major, "1");

    drop(plane);
    assert!(pids.iter().all(|&pid| !alive(pid)), "processes are gone");
    assert!(!dir.exists(), "data directory is removed");
}

/// A restarted API server serves the same etcd on the same address: what
/// was written before is there, and the same client reaches it.
#[tokio::test]
async fn a_restarted_apiserver_serves_the_same_storage() {
    let plane = ControlPlane::start().await.expect("start");
    let client = plane.client();
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client, "default");
    let map = serde_json::from_value(json!({
        "metadata": {"name": "kept"}, "data": {"k": "v"}
    }))
    .unwrap();
    maps.create(&PostParams::default(), &map).await.unwrap();

    plane.stop_apiserver();
    assert!(
        maps.get("kept").await.is_err(),
        "nothing answers while it is down"
    );
    plane.start_apiserver().await.expect("start again");
    let kept = maps.get("kept").await.unwrap();
    assert_eq!(kept.data.unwrap()["k"], "v");
}

#[test]
fn a_panicking_test_still_stops_its_control_plane() {
    let (tx, rx) = std::sync::mpsc::channel();
    let outcome = std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async move {
            let plane = ControlPlane::start().await.expect("start");
            tx.send((plane.pids().to_vec(), plane.data_dir().to_path_buf()))
                .unwrap();
            panic!("a test failing while it owns a control plane");
        })
    })
    .join();
    assert!(outcome.is_err(), "the thread panicked");
    let (pids, dir) = rx.recv().unwrap();
    assert!(pids.iter().all(|&pid| !alive(pid)), "processes are gone");
    assert!(!dir.exists(), "data directory is removed");
}
