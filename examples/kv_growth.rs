//! How `GrowKv` grows: appends 8192 positions of SmolLM2-135M geometry (30 layers,
//! `kv_dim` 192 = 3 KV heads × 64, `max_ctx` 8192) and prints the capacity and resident
//! bytes at each growth step beside the dense store's fixed
//! `30 · 8192 · 192 · 2 · 4 B = 377.5 MB`.
//!
//! Run: `cargo run --release --example kv_growth`

use kvcore::{DenseKv, GrowKv, KvError, KvStore};

const N_LAYERS: usize = 30;
const KV_DIM: usize = 192;
const MAX_CTX: usize = 8192;

fn mb(bytes: usize) -> f64 {
    bytes as f64 / 1e6
}

fn main() -> Result<(), KvError> {
    let dense = DenseKv::new(N_LAYERS, KV_DIM, MAX_CTX)?.bytes();
    let mut kv = GrowKv::new(N_LAYERS, KV_DIM, MAX_CTX)?;
    println!("GrowKv, {N_LAYERS} layers x kv_dim {KV_DIM}, max_ctx {MAX_CTX}");
    println!(
        "DenseKv holds {:.1} MB ({dense} B) from the start",
        mb(dense)
    );
    println!();
    println!(
        "{:>10} {:>9} {:>12} {:>10} {:>9}",
        "write pos", "capacity", "bytes", "MB", "of dense"
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
    let k_row = vec![0.5f32; KV_DIM];
    let v_row = vec![-0.5f32; KV_DIM];
    for pos in 0..MAX_CTX {
        let capacity = kv.capacity();
        for layer in 0..N_LAYERS {
            kv.k_mut(layer, pos)?.copy_from_slice(&k_row);
            kv.v_mut(layer, pos)?.copy_from_slice(&v_row);
        }
        if kv.capacity() != capacity {
            row(&pos.to_string(), &kv);
        }
    }
    println!();
    println!(
        "after {} positions: {:.1} MB resident, dense {:.1} MB",
        kv.seq_len(),
        mb(kv.bytes()),
        mb(dense)
    );
    Ok(())
}
