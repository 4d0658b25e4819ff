#!/usr/bin/python3
"""s3c.py — a small S3 client for the mounted S3 cases, so that they look at
the bucket with requests of their own, not through ckptfs. It runs curl
(--aws-sigv4, which Debian's curl 7.88 has) and parses the XML replies; no
boto3 needed. Importable (the cases' watchers poll with it) and a command:

    s3c.py list PREFIX              "KEY<TAB>SIZE" per object, every page
    s3c.py get KEY FILE             the object's bytes into FILE
    s3c.py put KEY FILE             FILE's bytes as the object KEY
    s3c.py head KEY                 "STATUS" then "name: value" header lines
    s3c.py uploads PREFIX           "KEY<TAB>UPLOAD_ID" per multipart upload in progress
    s3c.py delete KEY

Environment: S3_ENDPOINT (http://127.0.0.1:PORT), S3_BUCKET,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION (default us-east-1).
Exit status 0, or 1 with a message on any reply but 2xx (3 for a 404 on
get/head/delete, so callers can tell "missing" from "broken").
"""
import hashlib
import os
import subprocess
import sys
import urllib.parse
import xml.etree.ElementTree as ET

EMPTY_SHA = hashlib.sha256(b"").hexdigest()


class S3Error(Exception):
    def __init__(self, status, what):
        super().__init__(f"{what}: HTTP {status}")
        self.status = status


def _q(s, slash):
    return urllib.parse.quote(s, safe="/~" if slash else "~")


def request(method, key="", query=None, body=b"", head=False):
    """Returns (HTTP status, stdout bytes: the body, or the headers of a HEAD)."""
    ep, bucket = os.environ["S3_ENDPOINT"], os.environ["S3_BUCKET"]
    url = f"{ep}/{bucket}" + ("/" + _q(key, True) if key else "")
    if query:
        url += "?" + "&".join(f"{_q(k, False)}={_q(v, False)}" for k, v in sorted(query.items()))
    region = os.environ.get("AWS_REGION", "us-east-1")
    cmd = ["curl", "-sS", "--path-as-is", "--aws-sigv4", f"aws:amz:{region}:s3",
           "--user", f"{os.environ['AWS_ACCESS_KEY_ID']}:{os.environ['AWS_SECRET_ACCESS_KEY']}",
           "-H", "x-amz-content-sha256: " + hashlib.sha256(body).hexdigest(),
           "-w", "%{stderr}%{http_code}"]
    if head:
        cmd += ["-I"]
    else:
        cmd += ["-X", method]
    if body:
        cmd += ["--data-binary", "@-", "-H", "Content-Type: application/octet-stream"]
    p = subprocess.run(cmd + [url], input=body, capture_output=True)
    code = p.stderr.decode(errors="replace").strip()[-3:]
    if p.returncode != 0 or not code.isdigit():
        raise S3Error(0, f"{method} {url}: curl exit {p.returncode}: {p.stderr.decode(errors='replace').strip()}")
    return int(code), p.stdout


def _xml(body):
    root = ET.fromstring(body)
    ns = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
    return root, ns


def list_objects(prefix):
    """[(key, size)] of every object under `prefix`, following continuation tokens."""
    out, token = [], None
    while True:
        q = {"list-type": "2", "prefix": prefix}
        if token:
            q["continuation-token"] = token
        status, body = request("GET", query=q)
        if status != 200:
            raise S3Error(status, f"list {prefix}")
        root, ns = _xml(body)
        for c in root.findall(f"{ns}Contents"):
            out.append((c.find(f"{ns}Key").text or "", int(c.find(f"{ns}Size").text)))
        if root.findtext(f"{ns}IsTruncated") != "true":
            return out
        token = root.findtext(f"{ns}NextContinuationToken")


def list_uploads(prefix):
    status, body = request("GET", query={"uploads": "", "prefix": prefix})
    if status != 200:
        raise S3Error(status, f"list uploads {prefix}")
    root, ns = _xml(body)
    return [(u.findtext(f"{ns}Key"), u.findtext(f"{ns}UploadId")) for u in root.findall(f"{ns}Upload")]


def get(key):
    status, body = request("GET", key)
    if status != 200:
        raise S3Error(status, f"get {key}")
    return body


def put(key, data):
    status, body = request("PUT", key, body=data)
    if status != 200:
        raise S3Error(status, f"put {key}: {body[:200]!r}")


def main(argv):
    cmd, arg = argv[1], argv[2]
    try:
        if cmd == "list":
            for k, size in list_objects(arg):
                print(f"{k}\t{size}")
        elif cmd == "uploads":
            for k, uid in list_uploads(arg):
                print(f"{k}\t{uid}")
        elif cmd == "get":
            data = get(arg)
            with open(argv[3], "wb") as f:
                f.write(data)
        elif cmd == "put":
            with open(argv[3], "rb") as f:
                put(arg, f.read())
        elif cmd == "head":
            status, headers = request("HEAD", arg, head=True)
            print(status)
            sys.stdout.write(headers.decode(errors="replace").replace("\r", ""))
            if status == 404:
                return 3
            if status != 200:
                return 1
        elif cmd == "delete":
            status, _ = request("DELETE", arg)
            if status not in (200, 204):
                raise S3Error(status, f"delete {arg}")
        else:
            print(f"s3c.py: unknown command {cmd}", file=sys.stderr)
            return 2
    except S3Error as e:
        print(f"s3c.py: {e}", file=sys.stderr)
        return 3 if e.status == 404 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
