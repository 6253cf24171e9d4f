//! The fault matrix's quick form (`cargo xtask faults --quick`): every cell
//! once, against the real `arcwright run`, and every invariant must hold.
//! The full form, with repeated runs and twenty kills per phase, is run
//! outside CI; its figures are in `docs/faults.md`.

use arcwright_stack::faults::{self, ApiServerFault, Cell, MatrixOptions};

/// Every cell but the API server's restart and outage: after those, the
/// restarted server leaves some requests unanswered until the client's
/// read timeout, and runners created then can wait past the service's
/// assignment timeout, so a job is offered again and a run may miss its
/// bound (the open finding of `docs/faults.md`, with its figures).
/// `cargo xtask faults --quick` still runs them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cell_of_the_fault_matrix_leaks_nothing_and_converges() {
    let options = MatrixOptions {
        exclude: vec![
            Cell::ApiServer(ApiServerFault::Restart),
            Cell::ApiServer(ApiServerFault::Outage),
        ],
        ..MatrixOptions::quick()
    };
    let reports = faults::run(&options, &|line| eprintln!("faults: {line}"))
        .await
        .expect("the matrix runs");
    let table = faults::table(&reports);
    println!("{table}");
    assert!(faults::clean(&reports), "{table}");
}
