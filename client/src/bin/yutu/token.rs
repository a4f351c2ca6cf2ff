//! `yutu token issue`: signs a bearer token with the node's own key (from its data
//! directory), an HS256 secret from a `[[token_keys]]` entry of a config file, or an EdDSA or
//! RS256 private key, and prints it.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use yutu_api::token::{
    issue, parse_local_secret, Audience, BucketScope, Claims, ConductorScope, KeyAlgorithm,
    SigningKey, LOCAL_KID, LOCAL_SECRET_FILE,
};

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Print a new token.
    Issue(IssueArgs),
}

#[derive(Debug, Args)]
pub struct IssueArgs {
    /// Who the token is for: the owner of the buckets it creates, the holder of its leases.
    #[arg(long)]
    sub: String,
    /// A bucket (or prefix ending in `*`) and what the token may do there: letters of `rwdl`
    /// (read, write, delete, list), e.g. `models:rl` or `kv-*:rwdl`. Repeatable.
    #[arg(long = "bucket", value_name = "BUCKET:ACCESS")]
    buckets: Vec<String>,
    /// Full access to every bucket and the admin API.
    #[arg(long)]
    admin: bool,
    /// Conductor scopes: `route`, `events` (repeatable, or comma-separated).
    #[arg(long, value_delimiter = ',')]
    conductor: Vec<String>,
    /// How long the token lasts (e.g. 1h, 30m, 7days).
    #[arg(long, default_value = "1h")]
    ttl: humantime::Duration,
    /// Sign with the node's own key, kept in this data directory.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Sign with an HS256 secret read from this file (the `secret` of a `[[token_keys]]`
    /// entry, whose `kid` --kid names).
    #[arg(long, value_name = "FILE")]
    secret_file: Option<PathBuf>,
    /// Sign with this EdDSA or RS256 private key (PEM); --alg says which.
    #[arg(long, value_name = "FILE")]
    private_key_file: Option<PathBuf>,
    /// The algorithm of --private-key-file: EdDSA or RS256.
    #[arg(long)]
    alg: Option<String>,
    /// The key's id, as the node's `[[token_keys]]` names it (default with --data-dir: local).
    #[arg(long)]
    kid: Option<String>,
    /// The token's issuer (`iss`), for a key whose `[[token_keys]]` entry names an `issuer`.
    #[arg(long)]
    iss: Option<String>,
    /// Its audience (`aud`), for a key whose entry names an `audience`. Repeatable.
    #[arg(long)]
    aud: Vec<String>,
}

pub fn run(cmd: TokenCommand) -> Result<()> {
    match cmd {
        TokenCommand::Issue(args) => {
            println!("{}", issue_token(&args)?);
            Ok(())
        }
    }
}

fn issue_token(args: &IssueArgs) -> Result<String> {
    let buckets = args
        .buckets
        .iter()
        .map(|b| BucketScope::parse(b))
        .collect::<Result<Vec<_>, _>>()?;
    let conductor = args
        .conductor
        .iter()
        .map(|c| ConductorScope::parse(c.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    if buckets.is_empty() && conductor.is_empty() && !args.admin {
        bail!("the token would allow nothing: give --bucket, --conductor or --admin");
    }
    let (kid, key) = match (&args.data_dir, &args.secret_file, &args.private_key_file) {
        (Some(dir), None, None) => {
            let path = dir.join(LOCAL_SECRET_FILE);
            let text = std::fs::read_to_string(&path).with_context(|| {
                format!(
                    "reading {} (the node creates it at its first start)",
                    path.display()
                )
            })?;
            (
                args.kid.clone().unwrap_or_else(|| LOCAL_KID.to_string()),
                SigningKey::Secret(parse_local_secret(&text)?),
            )
        }
        (None, Some(file), None) => {
            let secret =
                std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
            let kid = args.kid.clone().context("--secret-file needs --kid")?;
            (kid, SigningKey::Secret(trim_newline(secret)))
        }
        (None, None, Some(file)) => {
            let pem = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
            let alg = match args.alg.as_deref() {
                Some("EdDSA") => KeyAlgorithm::EdDSA,
                Some("RS256") => KeyAlgorithm::RS256,
                _ => bail!("--private-key-file needs --alg EdDSA or --alg RS256"),
            };
            let kid = args.kid.clone().context("--private-key-file needs --kid")?;
            (kid, SigningKey::Pem(alg, pem))
        }
        _ => bail!("give exactly one of --data-dir, --secret-file, --private-key-file"),
    };
    let claims = Claims {
        admin: args.admin,
        buckets,
        conductor,
        iss: args.iss.clone(),
        aud: match args.aud.as_slice() {
            [] => None,
            [one] => Some(Audience::One(one.clone())),
            many => Some(Audience::Many(many.to_vec())),
        },
        ..Claims::new(&args.sub, args.ttl.into())
    };
    Ok(issue(&claims, &kid, &key)?)
}

/// A secret file written with `echo` ends with a newline that is not part of the secret.
fn trim_newline(mut s: Vec<u8>) -> Vec<u8> {
    while s.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        s.pop();
    }
    s
}
