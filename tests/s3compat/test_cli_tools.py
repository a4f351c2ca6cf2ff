"""aws-cli v1, s3cmd, rclone and curl (presigned URLs) against Yutu, at their defaults."""

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ALICE, ROOT

CLI_VENV = Path(os.environ.get("YUTU_CLI_VENV", ROOT / ".venv-cli"))


def tool(name):
    for candidate in [CLI_VENV / "bin" / name, shutil.which(name)]:
        if candidate and Path(candidate).exists():
            return str(candidate)
    pytest.fail(f"{name} is not installed: run scripts/install-test-deps.sh")


def run(args, env=None, cwd=None, drop=()):
    e = dict(os.environ, **(env or {}))
    for name in drop:
        e.pop(name, None)
    r = subprocess.run(args, env=e, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{args} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r.stdout


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture
def files(tmp_path):
    small = tmp_path / "small.txt"
    small.write_text("hello from a cli\n")
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(20 * 1024 * 1024))  # over every tool's multipart threshold
    return small, big


def aws_env(tmp_path):
    return {
        "AWS_ACCESS_KEY_ID": ALICE[0],
        "AWS_SECRET_ACCESS_KEY": ALICE[1],
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(tmp_path / "no-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials"),
    }


def test_aws_cli_v1(server, files, tmp_path):
    aws = [tool("aws"), "--endpoint-url", server.url]
    env = aws_env(tmp_path)
    assert run([tool("aws"), "--version"], env).strip() or True
    small, big = files
    run(aws + ["s3", "mb", "s3://awscli"], env)
    run(aws + ["s3", "cp", str(small), "s3://awscli/docs/small.txt"], env)
    run(aws + ["s3", "cp", str(big), "s3://awscli/big.bin"], env)
    listing = run(aws + ["s3", "ls", "s3://awscli/"], env)
    assert "PRE docs/" in listing and "big.bin" in listing
    run(aws + ["s3", "cp", "s3://awscli/big.bin", str(tmp_path / "big.out")], env)
    assert sha(tmp_path / "big.out") == sha(big)
    head = run(aws + ["s3api", "head-object", "--bucket", "awscli", "--key", "big.bin"], env)
    assert '"ContentLength": %d' % big.stat().st_size in head
    # Paginated listing through s3api.
    for i in range(30):
        run(aws + ["s3api", "put-object", "--bucket", "awscli", "--key", f"many/{i:02d}", "--body", str(small)], env)
    out = run(aws + ["s3api", "list-objects-v2", "--bucket", "awscli", "--prefix", "many/", "--page-size", "7", "--query", "Contents[].Key", "--output", "text"], env)
    assert out.split() == [f"many/{i:02d}" for i in range(30)]
    # A presigned GET, fetched with curl.
    url = run(aws + ["s3", "presign", "s3://awscli/docs/small.txt", "--expires-in", "300"], env).strip()
    assert run(["curl", "-sSf", url]) == small.read_text()
    run(aws + ["s3", "rm", "s3://awscli", "--recursive"], env)
    run(aws + ["s3", "rb", "s3://awscli"], env)
    assert "awscli" not in run(aws + ["s3", "ls"], env)


def test_s3cmd(server, files, tmp_path):
    cfg = tmp_path / "s3cfg"
    host = f"127.0.0.1:{server.port}"
    cfg.write_text(
        f"[default]\naccess_key = {ALICE[0]}\nsecret_key = {ALICE[1]}\nhost_base = {host}\n"
        f"host_bucket = {host}\nuse_https = False\nbucket_location = us-east-1\n"
    )
    s3cmd = [sys.executable if False else tool("s3cmd"), "-c", str(cfg)]
    small, big = files
    run(s3cmd + ["mb", "s3://s3cmd-bucket"])
    run(s3cmd + ["put", str(small), "s3://s3cmd-bucket/a/small.txt"])
    run(s3cmd + ["put", "--multipart-chunk-size-mb=5", str(big), "s3://s3cmd-bucket/big.bin"])
    listing = run(s3cmd + ["ls", "s3://s3cmd-bucket/"])
    assert "DIR" in listing and "a/" in listing and "big.bin" in listing
    run(s3cmd + ["get", "s3://s3cmd-bucket/big.bin", str(tmp_path / "big.out")])
    assert sha(tmp_path / "big.out") == sha(big)
    info = run(s3cmd + ["info", "s3://s3cmd-bucket/a/small.txt"])
    assert "File size:" in info
    run(s3cmd + ["del", "--recursive", "--force", "s3://s3cmd-bucket/"])
    run(s3cmd + ["rb", "s3://s3cmd-bucket"])


def test_rclone(server, files, tmp_path):
    env = {
        "RCLONE_CONFIG": str(tmp_path / "rclone.conf"),
        "RCLONE_CONFIG_YUTU_TYPE": "s3",
        "RCLONE_CONFIG_YUTU_PROVIDER": "Other",
        "RCLONE_CONFIG_YUTU_ENDPOINT": server.url,
        "RCLONE_CONFIG_YUTU_ACCESS_KEY_ID": ALICE[0],
        "RCLONE_CONFIG_YUTU_SECRET_ACCESS_KEY": ALICE[1],
        "RCLONE_CONFIG_YUTU_REGION": "us-east-1",
    }
    rclone = tool("rclone")
    # rclone 1.60's AWS SDK refuses AWS_CA_BUNDLE with its own HTTP transport; the endpoint
    # is plain HTTP anyway.
    real_run = run

    def run_(args, env=None):
        return real_run(args, env, drop=("AWS_CA_BUNDLE",))

    small, big = files
    src = tmp_path / "tree"
    (src / "sub").mkdir(parents=True)
    shutil.copy(small, src / "small.txt")
    shutil.copy(big, src / "sub" / "big.bin")
    run_([rclone, "mkdir", "yutu:rclone-bucket"], env)
    run_([rclone, "copy", str(src), "yutu:rclone-bucket/tree"], env)
    ls = run_([rclone, "ls", "yutu:rclone-bucket"], env)
    assert "tree/small.txt" in ls and "tree/sub/big.bin" in ls
    run_([rclone, "check", str(src), "yutu:rclone-bucket/tree"], env)
    run_([rclone, "copy", "yutu:rclone-bucket/tree", str(tmp_path / "back")], env)
    assert sha(tmp_path / "back" / "sub" / "big.bin") == sha(big)
    run_([rclone, "purge", "yutu:rclone-bucket"], env)


def test_curl_presigned_put_and_get(server, tmp_path):
    s3v4 = server.client(signature_version="s3v4")
    s3v4.create_bucket(Bucket="curl-bucket")
    src = tmp_path / "up.bin"
    src.write_bytes(os.urandom(300_000))
    put = s3v4.generate_presigned_url("put_object", Params={"Bucket": "curl-bucket", "Key": "up.bin"}, ExpiresIn=600)
    run(["curl", "-sSf", "-T", str(src), put])
    get = s3v4.generate_presigned_url("get_object", Params={"Bucket": "curl-bucket", "Key": "up.bin"}, ExpiresIn=600)
    run(["curl", "-sSf", "-o", str(tmp_path / "down.bin"), get])
    assert sha(tmp_path / "down.bin") == sha(src)
    # And boto3's default (SigV2) presigned URLs.
    v2 = server.client().generate_presigned_url("get_object", Params={"Bucket": "curl-bucket", "Key": "up.bin"}, ExpiresIn=600)
    run(["curl", "-sSf", "-o", str(tmp_path / "down2.bin"), v2])
    assert sha(tmp_path / "down2.bin") == sha(src)
