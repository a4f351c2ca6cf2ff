//! `yutu.BlockHasher`: the chained block hashes that name KV blocks, the same function as
//! the Rust `BlockHasher` (`yutu_api::block_hash`), so that an engine, the storage node and
//! the conductor agree on every key.

use pyo3::prelude::*;
use yutu_api::block_hash::{BlockHash, BlockHasher as Hasher};

use crate::errors::Error;

/// Names blocks of `block_tokens` tokens by the hash of the whole prefix they end.
#[pyclass(module = "yutu._native", frozen)]
pub struct BlockHasher {
    inner: Hasher,
}

#[pymethods]
impl BlockHasher {
    #[new]
    fn new(block_tokens: usize) -> PyResult<BlockHasher> {
        if block_tokens == 0 {
            return Err(Error::invalid("block_tokens must be at least 1").into());
        }
        Ok(BlockHasher {
            inner: Hasher::new(block_tokens),
        })
    }

    /// Tokens per block.
    #[getter]
    fn block_tokens(&self) -> usize {
        self.inner.block_tokens
    }

    /// The keys (64 lowercase hex characters) of every full block of `tokens`, in order; a
    /// partial last block has none. `parent` continues a chain after the key of the last block
    /// already hashed.
    #[pyo3(signature = (tokens, parent = None))]
    fn keys(
        &self,
        py: Python<'_>,
        tokens: Vec<u32>,
        parent: Option<&str>,
    ) -> PyResult<Vec<String>> {
        let parent = match parent {
            None => BlockHash::ROOT,
            Some(p) => BlockHash::from_key(p).ok_or_else(|| {
                Error::invalid(format!("{p:?} is not a block key (64 lowercase hex)"))
            })?,
        };
        let hasher = self.inner;
        Ok(py.detach(move || {
            hasher
                .hash_tokens_from(&parent, &tokens)
                .iter()
                .map(BlockHash::to_key)
                .collect()
        }))
    }

    fn __repr__(&self) -> String {
        format!("yutu.BlockHasher(block_tokens={})", self.inner.block_tokens)
    }
}
