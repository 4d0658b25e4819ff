// s3rver_strict.js — s3rver (a fake S3 in node) with strict SigV4 checks.
//
// s3rver 3.x accepts any AWS4-HMAC-SHA256 signature as long as the access
// key exists, so on its own it cannot catch a request that real S3 would
// refuse. This wrapper puts a middleware in front of it that recomputes the
// signature from the request as received, the way S3 does (canonical URI
// re-encoded from the decoded path, query parameters decoded, re-encoded and
// sorted, the signed headers, the payload hash taken from
// x-amz-content-sha256, which must be present and signed), and answers 403
// SignatureDoesNotMatch when it differs. It does not hash request bodies.
//
// It also closes three gaps between s3rver 3.7 and S3 that the ckptfs tests
// depend on (see fidelity() below): objects appear atomically (s3rver writes
// them in place, so a LIST or GET during a PUT, a copy or a crash of the
// server shows a partial object); keys keep ".", ".." and empty components
// (s3rver maps keys to paths with path.join, which folds "a/../b" into "b");
// and ListMultipartUploads and AbortMultipartUpload exist (s3rver answers
// 501 and 405), with parts refused for an upload that no longer exists.
//
// Usage: node s3rver_strict.js DATA_DIR PORT BUCKET[,BUCKET...]   (PORT 0 picks one)
// Prints "listening PORT" on stdout once it accepts connections.
'use strict';
const path = require('path');
const crypto = require('crypto');
const fs = require('fs');
const { Transform } = require('stream');
const { pipeline } = require('stream/promises');
const MODULES = path.join(__dirname, 'node', 'node_modules');
const S3rver = require(path.join(MODULES, 's3rver'));
const FilesystemStore = require(path.join(MODULES, 's3rver', 'lib', 'stores', 'filesystem'));
const S3Object = require(path.join(MODULES, 's3rver', 'lib', 'models', 'object'));

const [dataDir, port, bucket] = process.argv.slice(2);
const secrets = { S3RVER: 'S3RVER' };

const enc = s =>
  encodeURIComponent(s).replace(/[!'()*]/g, c => '%' + c.charCodeAt(0).toString(16).toUpperCase());
const dec = s => decodeURIComponent(s);
const sha256 = s => crypto.createHash('sha256').update(s).digest('hex');
const hmac = (k, s) => crypto.createHmac('sha256', k).update(s).digest();

function deny(ctx, code, message) {
  ctx.status = 403;
  ctx.type = 'application/xml';
  ctx.body = `<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>${code}</Code><Message>${message}</Message></Error>`;
}

async function verify(ctx, next) {
  const auth = ctx.get('authorization');
  if (!auth) return deny(ctx, 'AccessDenied', 'Anonymous access is forbidden');
  const m = /^AWS4-HMAC-SHA256 Credential=([^/]+)\/(\d{8})\/([^/]+)\/s3\/aws4_request, ?SignedHeaders=([^,]+), ?Signature=([0-9a-f]{64})$/.exec(auth);
  if (!m) return deny(ctx, 'AccessDenied', 'malformed Authorization header');
  const [, ak, day, region, signedList, sig] = m;
  const secret = secrets[ak];
  if (secret === undefined) return deny(ctx, 'InvalidAccessKeyId', 'The AWS Access Key Id you provided does not exist in our records.');
  const signed = signedList.split(';');
  const amzDate = ctx.get('x-amz-date');
  const payload = ctx.get('x-amz-content-sha256');
  if (!amzDate || !amzDate.startsWith(day)) return deny(ctx, 'AccessDenied', 'bad x-amz-date');
  if (!payload) return deny(ctx, 'InvalidRequest', 'Missing required header for this request: x-amz-content-sha256');
  for (const h of Object.keys(ctx.headers))
    if (h.startsWith('x-amz-') && !signed.includes(h)) return deny(ctx, 'AccessDenied', `header ${h} is not signed`);
  for (const h of ['host', 'x-amz-date', 'x-amz-content-sha256'])
    if (!signed.includes(h)) return deny(ctx, 'AccessDenied', `header ${h} must be signed`);

  const raw = ctx.req.url;
  const q = raw.indexOf('?');
  const rawPath = q < 0 ? raw : raw.slice(0, q);
  const rawQuery = q < 0 ? '' : raw.slice(q + 1);
  const uri = rawPath.split('/').map(seg => enc(dec(seg))).join('/');
  const query = rawQuery === '' ? '' : rawQuery.split('&').map(kv => {
    const i = kv.indexOf('=');
    const k = i < 0 ? kv : kv.slice(0, i), v = i < 0 ? '' : kv.slice(i + 1);
    return [enc(dec(k)), enc(dec(v))];
  }).sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : a[1] < b[1] ? -1 : a[1] > b[1] ? 1 : 0))
    .map(([k, v]) => `${k}=${v}`).join('&');
  const headers = signed.map(h => `${h}:${(ctx.get(h) || '').trim().replace(/ +/g, ' ')}\n`).join('');
  const canonical = [ctx.method, uri, query, headers, signedList, payload].join('\n');
  const scope = `${day}/${region}/s3/aws4_request`;
  const toSign = ['AWS4-HMAC-SHA256', amzDate, scope, sha256(canonical)].join('\n');
  let key = hmac('AWS4' + secret, day);
  key = hmac(hmac(hmac(key, region), 's3'), 'aws4_request');
  const want = crypto.createHmac('sha256', key).update(toSign).digest('hex');
  if (want !== sig) {
    console.error(`SIGV4 MISMATCH ${ctx.method} ${raw}\n--- canonical request ---\n${canonical}\n---`);
    return deny(ctx, 'SignatureDoesNotMatch', 'The request signature we calculated does not match the signature you provided.');
  }
  // A bucket policy stand-in for the tests: an object named forbidden-*
  // may be listed but not read (HEAD and GET answer 403).
  if ((ctx.method === 'HEAD' || ctx.method === 'GET') && /\/forbidden-[^/]*$/.test(dec(rawPath)))
    return deny(ctx, 'AccessDenied', 'Access Denied');
  return next();
}

// ---- fidelity: where s3rver's filesystem store differs from S3 ----------

// Keys as paths: every component but the last is a directory. A component
// that is empty, "." or ".." cannot be a file name, so it is escaped
// ("&" alone, "&2E", "&2E&2E"), and a literal '&' becomes "&26". The last
// component may be empty (a "dir/" marker) and stays so.
FilesystemStore.encodeKeyPath = key => {
  const parts = key.split('/');
  return parts.map((c, i) => {
    c = c.replace(/&/g, '&26');
    if (c === '.') return '&2E';
    if (c === '..') return '&2E&2E';
    if (c === '' && i < parts.length - 1) return '&';
    return c;
  }).join('/');
};
FilesystemStore.decodeKeyPath = p =>
  p.split('/').map(c => (c === '&' ? '' : c.replace(/&([0-9A-F]{2})/g, (_, h) => String.fromCharCode(parseInt(h, 16))))).join('/');

// Atomic objects: bytes, metadata and MD5 go to temporary files (never
// listed: they do not end in ._S3rver_object) and are renamed into place
// in one synchronous step, so no request sees a mix or a partial object.
let tmpSeq = 0;
const tmpName = p => `${p}.${process.pid}-${++tmpSeq}.tmp`;
const metadataJson = metadata => JSON.stringify({
  ...Object.fromEntries(Object.entries(metadata).filter(([k]) => S3Object.ALLOWED_METADATA.includes(k))),
  ...Object.fromEntries(Object.entries(metadata).filter(([k]) => k.startsWith('x-amz-meta-'))),
}, null, 2);

async function commitObject(store, bucket, key, objTmp, metaText, md5) {
  const objPath = store.getResourcePath(bucket, key, 'object');
  const metaPath = store.getResourcePath(bucket, key, 'metadata.json');
  const md5Path = store.getResourcePath(bucket, key, 'object.md5');
  const metaTmp = tmpName(metaPath), md5Tmp = tmpName(md5Path);
  try {
    if (metaText !== null) await fs.promises.writeFile(metaTmp, metaText);
    if (md5 !== null) await fs.promises.writeFile(md5Tmp, md5);
  } catch (err) {
    for (const f of [objTmp, metaTmp, md5Tmp]) fs.rmSync(f, { force: true });
    throw err;
  }
  if (metaText !== null) fs.renameSync(metaTmp, metaPath);
  else fs.rmSync(metaPath, { force: true });
  if (md5 !== null) fs.renameSync(md5Tmp, md5Path);
  else fs.rmSync(md5Path, { force: true });  // recomputed on the next read
  fs.renameSync(objTmp, objPath);
}

// Streams `content` into `file`, hashing it; resolves once the file stream
// has finished (pipeline), with the byte count and the MD5 hash.
async function writeHashed(content, file) {
  const md5 = crypto.createHash('md5');
  let size = 0;
  await pipeline(content, new Transform({
    transform(chunk, encoding, callback) {
      md5.update(chunk);
      size += chunk.length;
      callback(null, chunk);
    },
  }), fs.createWriteStream(file));
  return { size, md5 };
}

FilesystemStore.prototype.putObject = async function putObject(object) {
  const objPath = this.getResourcePath(object.bucket, object.key, 'object');
  await fs.promises.mkdir(path.dirname(objPath), { recursive: true });
  const tmp = tmpName(objPath);
  let md5 = crypto.createHash('md5');
  let size = 0;
  try {
    if (Buffer.isBuffer(object.content)) {
      md5.update(object.content);
      size = object.content.length;
      await fs.promises.writeFile(tmp, object.content);
    } else {
      ({ size, md5 } = await writeHashed(object.content, tmp));
    }
  } catch (err) {
    fs.rmSync(tmp, { force: true });
    throw err;
  }
  const digest = md5.digest('hex');
  await commitObject(this, object.bucket, object.key, tmp, metadataJson(object.metadata), digest);
  return { size, md5: digest };
};

// Parts whole on disk before the reply: s3rver's putPart answers when the
// last chunk has passed its MD5 transform, while up to 64 KiB may still sit
// in the file stream's buffer, so a CompleteMultipartUpload right after it
// concatenated a short part (seen on a busy machine: an object 65,536 bytes
// short, s3_server::multipart_copy_paths). Written to a temporary file
// through pipeline (which waits for the file stream to finish) and renamed.
// (`bucket` in the knob below is the function's argument, not the start's.)
FilesystemStore.prototype.putPart = async function putPart(bucket, uploadId, partNumber, content) {
  const partPath = path.join(this.getResourcePath(bucket, undefined, 'uploads'), uploadId, partNumber.toString());
  await fs.promises.mkdir(path.dirname(partPath), { recursive: true });
  const tmp = tmpName(partPath);
  let md5, size;
  try {
    ({ size, md5 } = await writeHashed(content, tmp));
  } catch (err) {
    fs.rmSync(tmp, { force: true });
    throw err;
  }
  // Test knob: the bug above, on purpose, for the client's check of what
  // it completed: DATA_DIR/../fault-short-part-BUCKET makes each part one
  // byte short on disk while the reply counts them all.
  if (fs.existsSync(path.join(dataDir, '..', `fault-short-part-${bucket}`))) fs.truncateSync(tmp, Math.max(0, size - 1));
  const digest = md5.digest('hex');
  await fs.promises.writeFile(`${partPath}.md5`, digest);
  fs.renameSync(tmp, partPath);
  return { size, md5: digest };
};

FilesystemStore.prototype.copyObject = async function copyObject(srcBucket, srcKey, destBucket, destKey, replacement) {
  const src = this.getResourcePath(srcBucket, srcKey, 'object');
  const dst = this.getResourcePath(destBucket, destKey, 'object');
  if (src === dst) {
    if (replacement) await this.putMetadata(destBucket, destKey, replacement);
    return this.getMetadata(destBucket, destKey);
  }
  await fs.promises.mkdir(path.dirname(dst), { recursive: true });
  const tmp = tmpName(dst);
  const readOr = (p, dflt) => fs.promises.readFile(p, 'utf8').catch(err => {
    if (err.code === 'ENOENT') return dflt;
    throw err;
  });
  try {
    await fs.promises.copyFile(src, tmp);
  } catch (err) {
    fs.rmSync(tmp, { force: true });
    throw err;
  }
  const metaText = replacement ? metadataJson(replacement)
    : await readOr(this.getResourcePath(srcBucket, srcKey, 'metadata.json'), null);
  const md5 = await readOr(this.getResourcePath(srcBucket, srcKey, 'object.md5'), null);
  await commitObject(this, destBucket, destKey, tmp, metaText, md5);
  return this.getMetadata(destBucket, destKey);
};

const xmlEscape = s => String(s).replace(/[&<>"']/g, c => `&#${c.charCodeAt(0)};`);

function s3error(ctx, status, code, message) {
  ctx.status = status;
  ctx.type = 'application/xml';
  ctx.body = `<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>${code}</Code><Message>${message}</Message></Error>`;
}

// s3rver's router matches /:bucket/:key+, which has no empty segment, so a
// key with an empty component ("a//b") would be a 404: fold each empty
// segment into the next one as an encoded '/' ("a/%2Fb"), which the router
// decodes back into the same key. Runs after verify (which signs the path
// as received).
async function emptySegments(ctx, next) {
  const q = ctx.path.indexOf('/', 1);
  if (q > 0 && ctx.path.indexOf('//', q) >= 0) {
    const head = ctx.path.slice(0, q + 1);
    let rest = ctx.path.slice(q + 1);
    while (rest.includes('//')) rest = rest.replace(/\/\//, '/%2F');
    if (rest.startsWith('/')) rest = '%2F' + rest.slice(1);
    ctx.path = head + rest;
  }
  return next();
}

// Multipart uploads live in DATA_DIR/BUCKET/._S3rver_uploads/ID/ (files
// `key`, `metadata`, and one per part), as s3rver keeps them. ListMultipartUploads
// and AbortMultipartUpload read and remove them; UploadPart and
// CompleteMultipartUpload of an id that is not there are NoSuchUpload.
async function uploads(ctx, next) {
  const store = ctx.store;
  const segs = ctx.path.split('/');  // ['', bucket, ...key]
  const bucket = decodeURIComponent(segs[1] || '');
  const key = segs.slice(2).map(decodeURIComponent).join('/');
  const q = ctx.query;
  const listing = ctx.method === 'GET' && segs.length === 2 && 'uploads' in q;
  const byId = 'uploadId' in q && segs.length > 2;
  if (!listing && !byId) return next();
  if (!bucket || !(await store.getBucket(bucket))) return s3error(ctx, 404, 'NoSuchBucket', 'The specified bucket does not exist');
  const root = store.getResourcePath(bucket, undefined, 'uploads');
  if (listing) {
    const prefix = q.prefix || '', keyMarker = q['key-marker'] || '', idMarker = q['upload-id-marker'] || '';
    const max = Math.max(1, Math.min(1000, Number(q['max-uploads'] || 1000)));
    let all = [];
    for (const id of fs.existsSync(root) ? fs.readdirSync(root) : []) {
      let k;
      try { k = fs.readFileSync(path.join(root, id, 'key'), 'utf8'); } catch { continue; }
      const initiated = fs.statSync(path.join(root, id)).mtime.toISOString();
      if (k.startsWith(prefix)) all.push({ key: k, id, initiated });
    }
    all.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
    all = all.filter(u => u.key > keyMarker || (u.key === keyMarker && idMarker && u.id > idMarker));
    const page = all.slice(0, max), truncated = all.length > max, last = page[page.length - 1];
    ctx.type = 'application/xml';
    ctx.body = '<?xml version="1.0" encoding="UTF-8"?>\n' +
      '<ListMultipartUploadsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">' +
      `<Bucket>${xmlEscape(bucket)}</Bucket><KeyMarker>${xmlEscape(keyMarker)}</KeyMarker>` +
      `<UploadIdMarker>${xmlEscape(idMarker)}</UploadIdMarker><Prefix>${xmlEscape(prefix)}</Prefix>` +
      (truncated ? `<NextKeyMarker>${xmlEscape(last.key)}</NextKeyMarker><NextUploadIdMarker>${last.id}</NextUploadIdMarker>` : '') +
      `<MaxUploads>${max}</MaxUploads><IsTruncated>${truncated}</IsTruncated>` +
      page.map(u => `<Upload><Key>${xmlEscape(u.key)}</Key><UploadId>${u.id}</UploadId>` +
        `<Initiated>${u.initiated}</Initiated><StorageClass>STANDARD</StorageClass></Upload>`).join('') +
      '</ListMultipartUploadsResult>';
    return;
  }
  // An upload id names a directory: only hex ids are ours.
  const id = q.uploadId;
  const dir = /^[0-9a-f]+$/.test(id) ? path.join(root, id) : null;
  let owner = null;
  try { owner = dir && fs.readFileSync(path.join(dir, 'key'), 'utf8'); } catch { owner = null; }
  if (owner !== key) return s3error(ctx, 404, 'NoSuchUpload', 'The specified upload does not exist.');
  if (ctx.method === 'DELETE') {
    fs.rmSync(dir, { recursive: true, force: true });
    ctx.status = 204;
    return;
  }
  return next();  // UploadPart, CompleteMultipartUpload on a live upload
}

const server = new S3rver({
  address: '127.0.0.1',
  port: Number(port),
  directory: dataDir,
  silent: true,
  configureBuckets: (bucket || '').split(',').filter(Boolean).map(name => ({ name, configs: [] })),
});
server.middleware.unshift(verify, emptySegments, uploads);
server.run().then(({ port: p }) => console.log(`listening ${p}`)).catch(err => {
  console.error(err);
  process.exit(1);
});
