//! The fault matrix's quick form (`cargo xtask faults --quick`): every cell
//! once, against the real `arcwright run`, and every invariant must hold.
//! The full form, with repeated runs and twenty kills per phase, is run
//! outside CI; its figures are in `docs/faults.md`.

use arcwright_stack::faults::{self, MatrixOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cell_of_the_fault_matrix_leaks_nothing_and_converges() {
    let reports = faults::run(&MatrixOptions::quick(), &|line| eprintln!("faults: {line}"))
        .await
        .expect("the matrix runs");
    let table = faults::table(&reports);
    println!("{table}");
    assert!(faults::clean(&reports), "{table}");
}
