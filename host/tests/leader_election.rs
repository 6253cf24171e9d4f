//! Leader election against a real API server: a leader that cannot reach
//! the API server steps down before its Lease can pass to a standby, so
//! two replicas never lead at once.

use std::time::Duration;

use arcwright::runtime::leader::Election;
use arcwright_harness::{TcpRelay, TestEnv, eventually};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::time::Instant;

/// Short enough for a quick test, long enough that a loaded machine's
/// slow answers do not look like a partition.
const LEASE: Duration = Duration::from_secs(6);

fn election(env: &TestEnv, identity: &str) -> Election {
    Election {
        namespace: env.namespace().to_owned(),
        lease: "arcwright-controller".to_owned(),
        identity: identity.to_owned(),
        duration: LEASE,
    }
}

/// A client whose traffic to the API server goes through `relay`.
fn client_through(env: &TestEnv, relay: &TcpRelay) -> kube::Client {
    env.control_plane().client_via(relay.address())
}

async fn holder(env: &TestEnv) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(env.client(), env.namespace());
    leases
        .get("arcwright-controller")
        .await
        .ok()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

#[tokio::test]
async fn a_leader_cut_off_from_the_api_server_steps_down_before_a_standby_takes_over() {
    let env = TestEnv::new("leader-cut-off").await;
    let relay = TcpRelay::start(env.control_plane().address())
        .await
        .unwrap();

    let mut leader = election(&env, "replica-a")
        .start(client_through(&env, &relay))
        .await
        .unwrap();
    let mut leading = leader.subscribe();
    tokio::time::timeout(Duration::from_secs(10), leading.wait_for(|l| *l))
        .await
        .expect("the first replica leads")
        .unwrap();
    let standby = election(&env, "replica-b")
        .start(env.client())
        .await
        .unwrap();
    let mut standby_leads = standby.subscribe();
    assert!(!*standby_leads.borrow());

    // The last renewal the leader can have made is the one the API server
    // holds now; from the cut on, nothing of the leader's gets through.
    relay.cut();
    let cut_at = Instant::now();
    tokio::time::timeout(LEASE * 2, leader.lost())
        .await
        .expect("the leader notices it cannot renew");
    let stepped_down = cut_at.elapsed();
    // The standby takes over only once the Lease expired as it sees it.
    tokio::time::timeout(LEASE * 4, standby_leads.wait_for(|l| *l))
        .await
        .expect("the standby takes over")
        .unwrap();
    let took_over = cut_at.elapsed();
    assert!(
        stepped_down < LEASE,
        "the leader stepped down {stepped_down:?} after the cut, past the lease ({LEASE:?})"
    );
    assert!(
        stepped_down < took_over,
        "the leader stepped down at {stepped_down:?}, after the standby led at {took_over:?}"
    );
    eventually(
        "the Lease names the standby",
        Duration::from_secs(5),
        || async { (holder(&env).await.as_deref() == Some("replica-b")).then_some(()) },
    )
    .await;

    // The old leader, released while cut off, must not take the Lease back.
    drop(leading);
    leader.release().await;
    assert_eq!(holder(&env).await.as_deref(), Some("replica-b"));
    standby.release().await;
    eventually(
        "the standby released the Lease",
        Duration::from_secs(5),
        || async { holder(&env).await.is_none().then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn a_released_lease_is_taken_at_once_and_a_held_one_is_left() {
    let env = TestEnv::new("leader-release").await;
    let first = election(&env, "replica-a")
        .start(env.client())
        .await
        .unwrap();
    let mut first_leads = first.subscribe();
    tokio::time::timeout(Duration::from_secs(10), first_leads.wait_for(|l| *l))
        .await
        .expect("the first replica leads")
        .unwrap();
    let second = election(&env, "replica-b")
        .start(env.client())
        .await
        .unwrap();
    let mut second_leads = second.subscribe();
    // The second replica has read the Lease (the first is named in it)
    // and left it: several of its attempts pass without it leading.
    let leases: Api<Lease> = Api::namespaced(env.client(), env.namespace());
    let renewed_at = |l: &Lease| l.spec.as_ref().and_then(|s| s.renew_time.clone());
    let before = renewed_at(&leases.get("arcwright-controller").await.unwrap());
    eventually(
        "the first replica renews",
        Duration::from_secs(10),
        || async {
            let now = renewed_at(&leases.get("arcwright-controller").await.unwrap());
            (now != before).then_some(())
        },
    )
    .await;
    assert_eq!(holder(&env).await.as_deref(), Some("replica-a"));
    assert!(
        !*second_leads.borrow(),
        "a held, renewed Lease is left alone"
    );

    let released_at = Instant::now();
    drop(first_leads);
    first.release().await;
    tokio::time::timeout(LEASE * 2, second_leads.wait_for(|l| *l))
        .await
        .expect("the second replica takes the released Lease")
        .unwrap();
    assert!(
        released_at.elapsed() < LEASE,
        "a released Lease is taken without waiting for it to expire ({:?})",
        released_at.elapsed()
    );
    drop(second_leads);
    second.release().await;
}
