"""A real browser: headless Chromium (Debian's, driven through chromium-driver by selenium)
loads a page served anonymously from a public-read bucket, and the page uploads a file with a
POST form to another bucket, cross-origin (CORS allows the page's origin); the object reads
back byte-identical.

The page is served virtual-host style (`http://site.localhost:PORT/index.html`, which
Chromium resolves to loopback) and posts path style to `http://127.0.0.1:PORT/drop`, so the
upload is cross-origin and needs the bucket's CORS rules."""

import json
import os
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>ready</title></head><body>
<form id="f"><input type="file" name="file" id="file"></form>
<script>
const post = %s;
document.getElementById("file").addEventListener("change", async () => {
  const fd = new FormData();
  for (const [k, v] of Object.entries(post.fields)) fd.append(k, v);
  fd.append("file", document.getElementById("file").files[0]);
  try {
    const r = await fetch(post.url, {method: "POST", body: fd});
    const text = await r.text();
    document.title = "done:" + r.status + ":" + (r.headers.get("ETag") || "");
    document.body.setAttribute("data-answer", text);
  } catch (e) {
    document.title = "failed:" + e;
  }
});
</script></body></html>"""


def serve_page(server, s3, site, drop, post):
    """Stores the upload page, public-read, in `site`; it posts `post`'s form to `drop`."""
    post["url"] = f"http://127.0.0.1:{server.port}/{drop}"
    s3.put_object(
        Bucket=site,
        Key="index.html",
        Body=(PAGE % json.dumps(post)).encode(),
        ContentType="text/html",
        ACL="public-read",
    )


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        opts.add_argument(a)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)


def test_a_page_from_a_public_bucket_uploads_with_a_post_form(server, s3, tmp_path):
    stamp = int(time.time() * 1000) % 10**9
    site, drop = f"site{stamp}", f"drop{stamp}"
    s3.create_bucket(Bucket=site, ACL="public-read")
    s3.create_bucket(Bucket=drop)
    page_origin = f"http://{site}.localhost:{server.port}"
    s3.put_bucket_cors(
        Bucket=drop,
        CORSConfiguration={
            "CORSRules": [
                {
                    "AllowedOrigins": [page_origin],
                    "AllowedMethods": ["POST"],
                    "AllowedHeaders": ["*"],
                    "ExposeHeaders": ["ETag"],
                }
            ]
        },
    )
    post = s3.generate_presigned_post(
        drop,
        "uploads/${filename}",
        Fields={"success_action_status": "201"},
        Conditions=[
            ["starts-with", "$key", "uploads/"],
            ["content-length-range", 1, 1 << 20],
            {"success_action_status": "201"},
        ],
    )
    serve_page(server, s3, site, drop, post)
    data = os.urandom(200_000)
    upload = tmp_path / "photo.bin"
    upload.write_bytes(data)

    driver = browser()
    try:
        driver.get(f"{page_origin}/index.html")
        assert driver.title == "ready", driver.page_source[:500]
        driver.find_element(By.ID, "file").send_keys(str(upload))
        WebDriverWait(driver, 30).until(lambda d: d.title != "ready")
        title = driver.title
        answer = driver.find_element(By.TAG_NAME, "body").get_attribute("data-answer")
    finally:
        driver.quit()
    assert title.startswith("done:201:"), title
    assert "<Key>uploads/photo.bin</Key>" in (answer or ""), answer
    got = s3.get_object(Bucket=drop, Key="uploads/photo.bin")
    assert got["Body"].read() == data
    # The ETag header was readable by the page: CORS exposed it.
    assert title == "done:201:" + got["ETag"]


def test_the_same_upload_without_cors_is_blocked_by_the_browser(server, s3, tmp_path):
    stamp = int(time.time() * 1000) % 10**9
    site, drop = f"nosite{stamp}", f"nodrop{stamp}"
    s3.create_bucket(Bucket=site, ACL="public-read")
    s3.create_bucket(Bucket=drop)
    post = s3.generate_presigned_post(drop, "blocked/${filename}")
    serve_page(server, s3, site, drop, post)
    upload = tmp_path / "x.bin"
    upload.write_bytes(b"x" * 100)
    driver = browser()
    try:
        driver.get(f"http://{site}.localhost:{server.port}/index.html")
        driver.find_element(By.ID, "file").send_keys(str(upload))
        WebDriverWait(driver, 30).until(lambda d: d.title != "ready")
        title = driver.title
    finally:
        driver.quit()
    # The request itself is simple (a form POST), so it reaches the node and is stored, but
    # without CORS headers the page may not read the answer: fetch fails.
    assert title.startswith("failed:"), title
    assert s3.head_object(Bucket=drop, Key="blocked/x.bin")["ContentLength"] == 100

