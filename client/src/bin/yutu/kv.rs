//! `yutu kv ...`: the KV block API through `yutu_client::kv::KvClient`.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use yutu_client::kv::{BlockHasher, KvClient, KvError, KvOptions};
use yutu_client::{Client, Credentials};

use crate::sink::Stdout;

#[derive(Debug, Subcommand)]
pub enum KvCommand {
    /// Store FILE as block KEY, written one-sidedly from a registered buffer.
    Put {
        bucket: String,
        key: String,
        file: PathBuf,
    },
    /// Fetch block KEY into a registered buffer (the server writes it), then into FILE.
    Get {
        bucket: String,
        key: String,
        file: PathBuf,
    },
    /// Print `true` or `false` and the key, one line per KEY.
    Exists {
        bucket: String,
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// Print how many leading blocks of a token sequence are stored.
    Prefix {
        bucket: String,
        /// File of whitespace-separated u32 token ids.
        #[arg(long)]
        tokens: PathBuf,
        /// Tokens per block.
        #[arg(long, default_value_t = 512)]
        block_tokens: usize,
    },
}

/// Keeps an S3 error reachable by `describe` (which looks for a `ClientError` in the chain).
fn kv(e: KvError) -> anyhow::Error {
    match e {
        KvError::Client(c) => c.into(),
        other => other.into(),
    }
}

pub fn run(
    url: &str,
    credentials: Option<Credentials>,
    token: Option<String>,
    cmd: KvCommand,
) -> Result<()> {
    let connect = || {
        let options = KvOptions {
            credentials: credentials.clone(),
            token: token.clone(),
            ..KvOptions::default()
        };
        KvClient::new(url, options).map_err(kv)
    };
    match cmd {
        KvCommand::Put { bucket, key, file } => put(&connect()?, &bucket, &key, &file),
        KvCommand::Get { bucket, key, file } => {
            // The block's size, to size the buffer: the block is an object too.
            let client = match &token {
                Some(t) => Client::with_token(url, t)?,
                None => Client::with_credentials(url, credentials.clone())?,
            };
            let size = client.head_object(&bucket, &key)?.size;
            get(&connect()?, &bucket, &key, size, &file)
        }
        KvCommand::Exists { bucket, keys } => {
            let found = connect()?.batch_exists(&bucket, &keys).map_err(kv)?;
            let mut out = Stdout::new();
            for (k, f) in keys.iter().zip(found) {
                if writeln!(out, "{f}\t{k}").is_err() && out.closed() {
                    return Ok(());
                }
            }
            out.finish().context("writing to stdout")
        }
        KvCommand::Prefix {
            bucket,
            tokens,
            block_tokens,
        } => {
            let text = std::fs::read_to_string(&tokens)
                .with_context(|| format!("reading {}", tokens.display()))?;
            let ids = parse_tokens(&text)?;
            let keys: Vec<String> = BlockHasher::new(block_tokens)
                .hash_tokens(&ids)
                .iter()
                .map(|h| h.to_key())
                .collect();
            let present = connect()?.prefix(&bucket, &keys).map_err(kv)?;
            println!("{present}");
            Ok(())
        }
    }
}

fn put(client: &KvClient, bucket: &str, key: &str, file: &Path) -> Result<()> {
    let data = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let len = data.len() as u64;
    let buf = client.register(len.max(1)).map_err(kv)?;
    buf.write_at(0, &data).map_err(kv)?;
    client
        .batch_put_from(bucket, &[key.to_string()], &buf, &[0], &[len])
        .map_err(kv)?;
    Ok(())
}

fn get(client: &KvClient, bucket: &str, key: &str, size: u64, file: &Path) -> Result<()> {
    let buf = client.register(size.max(1)).map_err(kv)?;
    let copied = client
        .batch_get_into_ranges(bucket, &[key.to_string()], &buf, &[0], &[buf.len()])
        .map_err(kv)?;
    let Some(Some(len)) = copied.first().copied() else {
        bail!("{bucket}/{key}: no such block");
    };
    let mut data = vec![0u8; usize::try_from(len).context("block too large")?];
    buf.read_at(0, &mut data).map_err(kv)?;
    std::fs::write(file, &data).with_context(|| format!("writing {}", file.display()))
}

fn parse_tokens(text: &str) -> Result<Vec<u32>> {
    text.split_whitespace()
        .map(|t| {
            t.parse::<u32>()
                .with_context(|| format!("{t:?} is not a token id"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_parse() {
        assert_eq!(parse_tokens(" 1 2\n3\t4 ").unwrap(), vec![1, 2, 3, 4]);
        assert!(parse_tokens("1 x").is_err());
        assert!(parse_tokens("").unwrap().is_empty());
    }
}
