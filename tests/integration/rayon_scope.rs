//! `Rayon::scope`, the spinning execution context of a forward pass: it runs `f` on a
//! pool worker, its result is `f`'s, and it never deadlocks: nested scopes, several
//! caller threads sharing one backend, more pool threads than cores, and a panicking
//! `f` (which must propagate and leave the backend usable). Each scenario runs under a
//! watchdog so that a deadlock fails the test instead of hanging the suite.

use kvcore::backend::{Backend, DType};
use kvcore_rayon::Rayon;
use kvcore_simd::Simd;
use kvcore_test_support::conformance::cases::{Case, Gemv};
use kvcore_test_support::conformance::oracle::bits;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;
use std::time::Duration;

/// Generous: every scenario takes well under a second on an idle 2-core machine.
const WATCHDOG: Duration = Duration::from_secs(120);

/// Runs `f` on its own thread and fails if it does not finish within [`WATCHDOG`].
fn within_watchdog(what: &str, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(WATCHDOG) {
        Ok(()) => {}
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: no result in {WATCHDOG:?}"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: the scenario panicked"),
    }
}

/// A parallel GEMV (SmolLM2's FFN up projection) and its bits from the inner backend.
fn gemv_case() -> (Gemv, Vec<u32>) {
    let case = Gemv::new(DType::Q4_1, 1536, 576, 0x5c0e);
    let want = bits(&case.run(&Simd::new()));
    (case, want)
}

/// Runs `f` under the watchdog named `what`, with a pool of `threads` over `Simd` and
/// [`gemv_case`].
fn on_pool(
    what: &str,
    threads: usize,
    f: impl FnOnce(&Rayon<Simd>, &Gemv, &[u32]) + Send + 'static,
) {
    within_watchdog(what, move || {
        let pool = Rayon::new(Simd::new(), threads).expect("pool");
        let (case, want) = gemv_case();
        f(&pool, &case, &want);
    });
}

#[test]
fn scope_runs_f_on_a_pool_worker_and_returns_its_result() {
    on_pool("scope result", 2, |pool, case, want| {
        let (on_worker, got) = pool.scope(|| (rayon::current_thread_index(), case.run(pool)));
        assert!(on_worker.is_some(), "f did not run on a pool worker");
        assert_eq!(bits(&got), want);
    });
}

#[test]
fn nested_scopes_complete() {
    on_pool("nested scopes", 2, |pool, case, want| {
        let got = pool.scope(|| pool.scope(|| pool.scope(|| case.run(pool))));
        assert_eq!(bits(&got), want);
    });
}

#[test]
fn concurrent_callers_share_one_backend() {
    for threads in [2, 3, 5] {
        on_pool("concurrent callers", threads, move |pool, case, want| {
            std::thread::scope(|s| {
                for _ in 0..4 {
                    s.spawn(|| {
                        for i in 0..40 {
                            // Alternate scoped passes with bare kernel calls.
                            let got = if i % 2 == 0 {
                                pool.scope(|| case.run(pool))
                            } else {
                                case.run(pool)
                            };
                            assert_eq!(bits(&got), want, "{threads} threads, call {i}");
                        }
                    });
                }
            });
        });
    }
}

#[test]
fn a_panicking_pass_propagates_and_leaves_the_backend_usable() {
    on_pool("panicking pass", 2, |pool, case, want| {
        let caught = catch_unwind(AssertUnwindSafe(|| {
            pool.scope(|| {
                let _ = case.run(pool);
                panic!("deliberate");
            })
        }));
        assert!(caught.is_err(), "the panic in f did not reach the caller");
        assert_eq!(bits(&pool.scope(|| case.run(pool))), want);
    });
}

/// `Backend::join` inside and outside a scope, on 1 and 2 threads: both closures run
/// (each a parallel GEMV of its own, nested in the join), the results come back in
/// order with the inner backend's bits, and nested joins complete.
#[test]
fn joins_return_both_results_in_order() {
    within_watchdog("joins", || {
        let (case, want) = gemv_case();
        let other = Gemv::new(DType::Q8_0, 576, 1536, 0x7a11);
        let other_want = bits(&other.run(&Simd::new()));
        for threads in [1, 2] {
            let pool = Rayon::new(Simd::new(), threads).expect("pool");
            let (a, b) = pool.join(|| case.run(&pool), || other.run(&pool));
            assert_eq!((bits(&a), bits(&b)), (want.clone(), other_want.clone()));
            let (a, (b, c)) = pool.scope(|| {
                pool.join(
                    || case.run(&pool),
                    || pool.join(|| other.run(&pool), || case.run(&pool)),
                )
            });
            assert_eq!(bits(&a), want, "{threads} threads");
            assert_eq!(bits(&b), other_want, "{threads} threads");
            assert_eq!(bits(&c), want, "{threads} threads");
        }
    });
}

/// A panic in either closure of a join reaches the caller, and the backend stays usable.
#[test]
fn a_panicking_join_propagates_and_leaves_the_backend_usable() {
    on_pool("panicking join", 2, |pool, case, want| {
        for first in [true, false] {
            let caught = catch_unwind(AssertUnwindSafe(|| {
                pool.scope(|| {
                    pool.join(
                        || assert!(!first, "deliberate"),
                        || assert!(first, "deliberate"),
                    )
                })
            }));
            assert!(caught.is_err(), "the panic did not reach the caller");
        }
        assert_eq!(bits(&pool.scope(|| case.run(pool))), want);
    });
}

/// A pool spins only with a core per thread: more threads than cores (here four times
/// the cores) run each pass as a plain `install`, with the same bits.
#[test]
fn an_oversubscribed_pool_does_not_spin() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let fitting = Rayon::new(Simd::new(), cores).expect("pool");
    assert_eq!(
        fitting.spins(),
        cores > 1,
        "{cores} threads on {cores} cores"
    );
    let over = Rayon::new(Simd::new(), 4 * cores).expect("pool");
    assert!(!over.spins(), "{} threads on {cores} cores", 4 * cores);
    on_pool("oversubscribed", 4 * cores, |pool, case, want| {
        assert_eq!(bits(&pool.scope(|| case.run(pool))), want);
    });
}
