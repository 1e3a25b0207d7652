//! How `GrowKv` grows: appends 8192 positions of SmolLM2-135M geometry (30 layers,
//! `kv_dim` 192 = 3 KV heads × 64, `max_ctx` 8192) and prints the capacity and resident
//! bytes at each growth step beside the dense store's fixed
//! `30 · 8192 · 192 · 2 · 4 B = 377.5 MB`.
//!
//! Run: `cargo run --release --example kv_growth`

use kvcore::ndarray::Array2;
use kvcore::{Append, DenseKv, GrowKv, KvError, KvGeometry, KvStore};

/// SmolLM2-135M: 30 layers of 3 KV heads of 64 (`kv_dim` 192).
const GEOMETRY: KvGeometry = KvGeometry {
    n_layers: 30,
    n_kv_heads: 3,
    head_dim: 64,
};
const MAX_CTX: usize = 8192;

fn mb(bytes: usize) -> f64 {
    bytes as f64 / 1e6
}

fn main() -> Result<(), KvError> {
    let dense = DenseKv::new(GEOMETRY, MAX_CTX)?.bytes();
    let mut kv = GrowKv::new(GEOMETRY, MAX_CTX)?;
    let (n_layers, kv_dim) = (GEOMETRY.n_layers, GEOMETRY.kv_dim());
    println!("GrowKv, {n_layers} layers x kv_dim {kv_dim}, max_ctx {MAX_CTX}");
    println!(
        "DenseKv holds {:.1} MB ({dense} B) from the start",
        mb(dense)
    );
    println!();
    println!(
        "{:>10} {:>9} {:>12} {:>10} {:>9}",
        "append at", "capacity", "bytes", "MB", "of dense"
    );
    let row = |pos: &str, kv: &GrowKv| {
        println!(
            "{pos:>10} {:>9} {:>12} {:>10.1} {:>8.1}%",
            kv.capacity(),
            kv.bytes(),
            mb(kv.bytes()),
            100.0 * kv.bytes() as f64 / dense as f64
        );
    };
    row("(new)", &kv);
    let k_row = Array2::from_elem((1, kv_dim), 0.5f32); // [1, kv_dim]
    let v_row = Array2::from_elem((1, kv_dim), -0.5f32);
    for pos in 0..MAX_CTX {
        let capacity = kv.capacity();
        // One decode step's append: every layer's row, then the commit.
        let mut tx = Append::begin(&mut kv, pos, 1)?;
        for layer in 0..n_layers {
            tx.write(layer, k_row.view(), v_row.view())?;
        }
        tx.commit()?;
        if kv.capacity() != capacity {
            row(&pos.to_string(), &kv);
        }
    }
    println!();
    println!(
        "after {} positions: {:.1} MB resident, dense {:.1} MB",
        kv.len(),
        mb(kv.bytes()),
        mb(dense)
    );
    Ok(())
}
