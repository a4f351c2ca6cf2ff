//! `yutu`: the command-line client for a Yutu server's S3-like object API.
//!
//! Each subcommand is one S3 operation (or a listing walk) through `yutu_client::Client`;
//! `admin` calls the storage admin API through `yutu_client::AdminClient` (`admin.rs`).
//! Success is quiet except for what was asked for (listings, `stat`, object bytes, admin
//! reports on stdout);
//! a failure prints `yutu: <S3 code>: <message>` (or `yutu: <what went wrong>`) to stderr and
//! exits with status 1, so scripts can test `$?` and grep the code.

mod admin;
mod commands;
mod format;
mod kv;
mod progress;
mod sink;
mod spool;
mod target;
mod token;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use yutu_client::{AdminClient, BucketOptions, Client, ClientError, CredentialSource, Durability};

#[derive(Debug, Parser)]
#[command(
    name = "yutu",
    version,
    about = "Command-line client for Yutu's S3-like object API"
)]
struct Cli {
    /// Server base URL.
    #[arg(
        long,
        global = true,
        env = "YUTU_URL",
        default_value = "http://127.0.0.1:9000"
    )]
    url: String,

    /// Access key to sign requests with (SigV4). Without keys here, in the environment or in
    /// a credentials file, requests go unsigned (a node started with --no-auth).
    #[arg(long, global = true, env = "AWS_ACCESS_KEY_ID", hide_env_values = true)]
    access_key: Option<String>,

    /// Secret key that goes with --access-key.
    #[arg(
        long,
        global = true,
        env = "AWS_SECRET_ACCESS_KEY",
        hide_env_values = true
    )]
    secret_key: Option<String>,

    /// Bearer token to send instead of signing (from `yutu token issue`, or the one a node
    /// prints and saves at its first start).
    #[arg(long, global = true, env = "YUTU_TOKEN", hide_env_values = true)]
    token: Option<String>,

    /// Profile of the shared credentials file to use (default: `default`).
    #[arg(long, global = true, env = "AWS_PROFILE")]
    profile: Option<String>,

    /// The shared credentials file (default: ~/.aws/credentials).
    #[arg(long, global = true, env = "AWS_SHARED_CREDENTIALS_FILE")]
    credentials_file: Option<std::path::PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Make a bucket.
    Mb {
        /// BUCKET (an `s3://` prefix is accepted everywhere).
        bucket: String,
        /// Copies of every object in a cluster, 1 to 7 (default: the node's --replicas).
        #[arg(long, value_name = "N")]
        replicas: Option<u32>,
        /// Where objects must be before a PUT is acknowledged (default: the node's
        /// --durability).
        #[arg(long, value_enum)]
        durability: Option<DurabilityArg>,
        /// Most bytes of objects the bucket may hold, whatever the replica count (e.g.
        /// 10GiB); writes past it are refused with QuotaExceeded. Default: no quota.
        #[arg(long, value_name = "SIZE")]
        quota: Option<yutu_api::ByteSize>,
    },
    /// Remove an empty bucket.
    Rb { bucket: String },
    /// List buckets, or the objects of BUCKET[/PREFIX] ("folders" as PRE lines unless
    /// --recursive). Object lines are `size  last-modified  key`.
    Ls {
        /// BUCKET or BUCKET/PREFIX; none lists the buckets.
        target: Option<String>,
        /// List every key under the prefix instead of rolling up at "/".
        #[arg(short, long)]
        recursive: bool,
    },
    /// Upload FILE ("-" for stdin) to BUCKET/KEY. A KEY that is empty or ends with "/" gets
    /// the file's name appended.
    Put {
        file: PathBuf,
        target: String,
        /// Content-Type to store with the object.
        #[arg(long)]
        content_type: Option<String>,
    },
    /// Download BUCKET/KEY to FILE (a directory gets the key's last segment; none or "-"
    /// writes to stdout).
    Get {
        target: String,
        file: Option<PathBuf>,
    },
    /// Delete an object.
    Rm { target: String },
    /// Show an object's size, ETag, last-modified time and content type; or, for a BUCKET,
    /// its durability, quota and the bytes it holds.
    Stat { target: String },
    /// KV blocks through the KV API, bytes moved one-sidedly by a transfer engine.
    Kv {
        #[command(subcommand)]
        command: kv::KvCommand,
    },
    /// The storage admin API (an admin identity only): nodes, stats, evict, pin, unpin,
    /// replicate, drain, status, for the whole cluster through any node.
    Admin(admin::AdminArgs),
    /// Bearer tokens: `yutu token issue --data-dir DIR --sub NAME --bucket NAME:rwdl`.
    Token {
        #[command(subcommand)]
        command: token::TokenCommand,
    },
}

/// `mb --durability`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum DurabilityArg {
    /// DRAM only: fastest; lost on restart unless demoted to NVMe meanwhile.
    Memory,
    /// Written through to NVMe before a PUT is acknowledged.
    Disk,
}

impl From<DurabilityArg> for Durability {
    fn from(d: DurabilityArg) -> Durability {
        match d {
            DurabilityArg::Memory => Durability::Memory,
            DurabilityArg::Disk => Durability::Disk,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("yutu: {}", describe(&e));
            ExitCode::FAILURE
        }
    }
}

/// Where the keys come from: flags, else `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (clap
/// reads the environment for the same arguments, a flag wins), else the profile
/// (`--profile`, `AWS_PROFILE`, `default`) of the shared credentials file.
/// `AWS_SESSION_TOKEN` is not used: Yutu users have long-term keys only.
fn credential_source(cli: &Cli) -> CredentialSource {
    CredentialSource {
        access_key: cli.access_key.clone(),
        secret_key: cli.secret_key.clone(),
        profile: cli.profile.clone(),
        file: cli.credentials_file.clone(),
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    if let Command::Token { command } = cli.command {
        return token::run(command);
    }
    let credentials = match &cli.token {
        Some(_) => None,
        None => credential_source(&cli).resolve()?,
    };
    let client = match &cli.token {
        Some(token) => Client::with_token(&cli.url, token)?,
        None => Client::with_credentials(&cli.url, credentials.clone())?,
    };
    match cli.command {
        Command::Mb {
            bucket,
            replicas,
            durability,
            quota,
        } => {
            let options = BucketOptions {
                replicas,
                durability: durability.map(Durability::from),
                quota: quota.map(|q| q.0),
            };
            commands::make_bucket(&client, &bucket, &options)
        }
        Command::Rb { bucket } => commands::remove_bucket(&client, &bucket),
        Command::Ls { target, recursive } => commands::list(&client, target.as_deref(), recursive),
        Command::Put {
            file,
            target,
            content_type,
        } => commands::put(&client, &file, &target, content_type.as_deref()),
        Command::Get { target, file } => commands::get(&client, &target, file.as_deref()),
        Command::Rm { target } => commands::remove(&client, &target),
        Command::Stat { target } => commands::stat(&client, &target),
        Command::Kv { command } => kv::run(&cli.url, credentials, cli.token, command),
        Command::Admin(args) => {
            let anonymous = cli.token.is_none() && credentials.is_none();
            admin::run(&AdminClient::new(client), args, anonymous)
        }
        Command::Token { .. } => unreachable!("handled above"),
    }
}

/// The error line: an S3 error anywhere in the chain is shown as the server's code and
/// message alone (context would bury the code scripts look for); anything else shows the
/// whole chain.
fn describe(e: &anyhow::Error) -> String {
    for cause in e.chain() {
        if let Some(ClientError::S3 { code, message, .. }) = cause.downcast_ref::<ClientError>() {
            return format!("{code}: {message}");
        }
    }
    format!("{e:#}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn s3_errors_print_code_and_message() {
        let e = anyhow::Error::new(ClientError::S3 {
            status: 404,
            code: "NoSuchKey".into(),
            message: "The specified key does not exist.".into(),
        })
        .context("downloading b/k");
        assert_eq!(describe(&e), "NoSuchKey: The specified key does not exist.");
        let e = anyhow::anyhow!("disk full").context("writing out");
        assert_eq!(describe(&e), "writing out: disk full");
    }

    /// Flags over the environment over the credentials file. The only test that sets the
    /// AWS variables (others do not read them).
    #[test]
    fn credentials_precedence() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("credentials");
        std::fs::write(
            &file,
            "[default]\naws_access_key_id = FILE\naws_secret_access_key = file-secret\n\
             [other]\naws_access_key_id = OTHER\naws_secret_access_key = other-secret\n",
        )
        .unwrap();
        let file = file.to_str().unwrap();
        let key = |args: &[&str]| {
            let mut all = vec!["yutu", "--credentials-file", file];
            all.extend_from_slice(args);
            all.push("ls");
            let cli = Cli::try_parse_from(all).unwrap();
            credential_source(&cli)
                .resolve()
                .unwrap()
                .map(|c| (c.access_key, c.secret_key))
        };
        let pair = |a: &str, s: &str| Some((a.to_string(), s.to_string()));
        for var in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"] {
            std::env::remove_var(var);
        }
        assert_eq!(key(&[]), pair("FILE", "file-secret"));
        assert_eq!(key(&["--profile", "other"]), pair("OTHER", "other-secret"));
        std::env::set_var("AWS_PROFILE", "other");
        assert_eq!(key(&[]), pair("OTHER", "other-secret"));
        std::env::set_var("AWS_ACCESS_KEY_ID", "ENV");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "env-secret");
        assert_eq!(key(&[]), pair("ENV", "env-secret"));
        assert_eq!(
            key(&["--access-key", "FLAG", "--secret-key", "flag-secret"]),
            pair("FLAG", "flag-secret")
        );
        for var in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"] {
            std::env::remove_var(var);
        }
        let none = Cli::try_parse_from(["yutu", "--credentials-file", "/nonexistent", "ls"]);
        assert!(credential_source(&none.unwrap())
            .resolve()
            .unwrap()
            .is_none());
    }

    #[test]
    fn parses_commands() {
        let cli = Cli::try_parse_from(["yutu", "--url", "http://h:1", "ls", "b/p", "-r"]).unwrap();
        assert_eq!(cli.url, "http://h:1");
        assert!(matches!(
            cli.command,
            Command::Ls {
                recursive: true,
                ..
            }
        ));
        let cli = Cli::try_parse_from(["yutu", "get", "b/k", "--url", "http://h:2"]).unwrap();
        assert_eq!(cli.url, "http://h:2");
        assert!(Cli::try_parse_from(["yutu", "put", "f"]).is_err());
    }

    #[test]
    fn parses_mb_settings_and_admin_commands() {
        let cli =
            Cli::try_parse_from(["yutu", "mb", "b", "--replicas", "2", "--durability", "disk"])
                .unwrap();
        assert!(matches!(
            cli.command,
            Command::Mb {
                replicas: Some(2),
                durability: Some(DurabilityArg::Disk),
                ..
            }
        ));
        assert!(Cli::try_parse_from(["yutu", "mb", "b", "--durability", "tape"]).is_err());
        let cli = Cli::try_parse_from(["yutu", "mb", "b", "--quota", "2MiB"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Mb {
                quota: Some(yutu_api::ByteSize(2097152)),
                ..
            }
        ));
        assert!(Cli::try_parse_from(["yutu", "mb", "b", "--quota", "lots"]).is_err());
        let parses = |args: &[&str]| {
            let mut all = vec!["yutu", "admin"];
            all.extend_from_slice(args);
            Cli::try_parse_from(all).is_ok()
        };
        assert!(parses(&["nodes", "--json"]));
        assert!(parses(&["--json", "stats"]));
        assert!(parses(&["evict", "b/k"]));
        assert!(parses(&["evict", "b", "--prefix", "p/"]));
        assert!(parses(&["evict", "--node", "n", "--free", "512MiB"]));
        assert!(!parses(&["evict"]), "something to evict");
        assert!(!parses(&["evict", "--free", "1GiB"]), "--free needs --node");
        assert!(
            !parses(&["evict", "b", "--node", "n"]),
            "--node needs --free"
        );
        assert!(!parses(&["evict", "b", "--node", "n", "--free", "1"]));
        assert!(parses(&["pin", "b/k", "--soft-ttl", "60"]));
        assert!(parses(&["unpin", "b", "--prefix", "p"]));
        assert!(parses(&["replicate", "b/k", "--replicas", "3"]));
        assert!(parses(&["replicate", "b/k", "--node", "node1"]));
        assert!(!parses(&["replicate", "b/k"]), "replicas or a node");
        assert!(!parses(&[
            "replicate",
            "b/k",
            "--replicas",
            "3",
            "--node",
            "n"
        ]));
        assert!(parses(&["drain", "node2", "--wait", "--timeout", "30"]));
        assert!(!parses(&["drain", "node2", "--wait", "--cancel"]));
        assert!(parses(&["status", "--wait"]));
    }
}
