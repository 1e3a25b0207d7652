//! TEMPORARY scaffolding, replaced by the KV store work (issue 2).
use super::{KvError, KvStore};

/// Scaffolding.
#[derive(Debug)]
pub struct GrowKv;

impl KvStore for GrowKv {
    fn n_layers(&self) -> usize { todo!() }
    fn kv_dim(&self) -> usize { todo!() }
    fn max_ctx(&self) -> usize { todo!() }
    fn capacity(&self) -> usize { todo!() }
    fn seq_len(&self) -> usize { todo!() }
    fn k_mut(&mut self, _: usize, _: usize) -> Result<&mut [f32], KvError> { todo!() }
    fn v_mut(&mut self, _: usize, _: usize) -> Result<&mut [f32], KvError> { todo!() }
    fn k(&self, _: usize, _: usize) -> &[f32] { todo!() }
    fn v(&self, _: usize, _: usize) -> &[f32] { todo!() }
    fn keys(&self, _: usize) -> &[f32] { todo!() }
    fn values(&self, _: usize) -> &[f32] { todo!() }
    fn set_seq_len(&mut self, _: usize) -> Result<(), KvError> { todo!() }
    fn clear(&mut self) { todo!() }
    fn bytes(&self) -> usize { todo!() }
}
