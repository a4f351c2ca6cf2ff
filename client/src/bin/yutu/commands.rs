//! What each subcommand does, on top of `yutu_client::Client`.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

use anyhow::{Context, Result};
use yutu_client::{BucketOptions, Client};

use crate::format;
use crate::progress;
use crate::sink::{PendingFile, Stdout};
use crate::spool::spool;
use crate::target::Target;

pub fn make_bucket(client: &Client, arg: &str, options: &BucketOptions) -> Result<()> {
    Ok(client.create_bucket_with(&Target::parse_bucket(arg)?, options)?)
}

pub fn remove_bucket(client: &Client, arg: &str) -> Result<()> {
    Ok(client.delete_bucket(&Target::parse_bucket(arg)?)?)
}

pub fn remove(client: &Client, arg: &str) -> Result<()> {
    let t = Target::parse_object(arg)?;
    Ok(client.delete_object(&t.bucket, &t.key)?)
}

pub fn stat(client: &Client, arg: &str) -> Result<()> {
    let t = Target::parse(arg)?;
    let lines = if t.key.is_empty() {
        let status = client
            .bucket_status(&t.bucket)?
            .with_context(|| format!("bucket {} does not exist", t.bucket))?;
        format::bucket_stat_lines(&t.bucket, &status)
    } else {
        let info = client.head_object(&t.bucket, &t.key)?;
        format::stat_lines(&t.bucket, &t.key, &info)
    };
    let mut out = Stdout::new();
    for line in lines {
        if writeln!(out, "{line}").is_err() && out.closed() {
            return Ok(());
        }
    }
    out.finish().context("writing to stdout")
}

/// `ls`: buckets, or one listing walked page by page so that output starts at once and
/// memory stays flat however many keys there are.
pub fn list(client: &Client, arg: Option<&str>, recursive: bool) -> Result<()> {
    let mut out = Stdout::new();
    let written = match arg {
        None => list_buckets(client, &mut out),
        Some(arg) => list_objects(client, &Target::parse(arg)?, recursive, &mut out),
    };
    match written {
        Err(e) if out.closed() && is_io(&e) => Ok(()),
        Err(e) => Err(e),
        Ok(()) => out.finish().context("writing to stdout"),
    }
}

fn list_buckets(client: &Client, out: &mut Stdout) -> Result<()> {
    for b in client.list_buckets()? {
        writeln!(out, "{}", format::bucket_line(&b))?;
    }
    Ok(())
}

fn list_objects(client: &Client, t: &Target, recursive: bool, out: &mut Stdout) -> Result<()> {
    let prefix = (!t.key.is_empty()).then_some(t.key.as_str());
    let delimiter = (!recursive).then_some("/");
    for page in client.list_pages(&t.bucket, prefix, delimiter) {
        let page = page?;
        for p in &page.common_prefixes {
            writeln!(out, "{}", format::prefix_line(p))?;
        }
        for o in &page.objects {
            writeln!(out, "{}", format::object_line(o))?;
        }
    }
    Ok(())
}

/// `put`: streams a file (or spooled stdin) with its exact length.
pub fn put(client: &Client, file: &Path, arg: &str, content_type: Option<&str>) -> Result<()> {
    let t = Target::parse(arg)?;
    let (source, len, file_name) = if file.as_os_str() == "-" {
        let (f, len) = spool(io::stdin().lock())?;
        (f, len, None)
    } else {
        let f = File::open(file).with_context(|| format!("opening {}", file.display()))?;
        let meta = f
            .metadata()
            .with_context(|| format!("reading {}", file.display()))?;
        if !meta.is_file() {
            anyhow::bail!("{} is not a regular file", file.display());
        }
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_string);
        (f, meta.len(), name)
    };
    let key = t.upload_key(file_name.as_deref())?;
    let bar = progress::for_transfer(len, format!("put {}/{key}", t.bucket));
    let result = client.put_object(&t.bucket, &key, bar.wrap_read(source), len, content_type);
    bar.finish_and_clear();
    result?;
    Ok(())
}

/// `get`: streams the object to stdout or into a file that appears only when complete.
pub fn get(client: &Client, arg: &str, file: Option<&Path>) -> Result<()> {
    let t = Target::parse_object(arg)?;
    let mut obj = client.get_object(&t.bucket, &t.key, None)?;
    let bar = progress::for_transfer(obj.content_length, format!("get {}/{}", t.bucket, t.key));
    let result = match file.filter(|f| f.as_os_str() != "-") {
        None => {
            let mut out = Stdout::new();
            match io::copy(&mut obj, &mut bar.wrap_write(&mut out)) {
                Err(_) if out.closed() => Ok(()),
                Err(e) => Err(e).context("downloading to stdout"),
                Ok(_) => out.finish().context("writing to stdout"),
            }
        }
        Some(path) => {
            let path = if path.is_dir() {
                path.join(last_segment(&t.key))
            } else {
                path.to_path_buf()
            };
            let mut pending = PendingFile::create(&path)?;
            io::copy(&mut obj, &mut bar.wrap_write(&mut pending))
                .with_context(|| format!("downloading to {}", path.display()))?;
            pending.commit()
        }
    };
    bar.finish_and_clear();
    result
}

/// The file name a key gets when downloaded into a directory.
fn last_segment(key: &str) -> &str {
    key.trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|s| !s.is_empty())
        .unwrap_or("object")
}

fn is_io(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<io::Error>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn download_names() {
        assert_eq!(last_segment("a/b/c.bin"), "c.bin");
        assert_eq!(last_segment("c.bin"), "c.bin");
        assert_eq!(last_segment("dir/"), "dir");
        assert_eq!(last_segment("/"), "object");
    }
}
