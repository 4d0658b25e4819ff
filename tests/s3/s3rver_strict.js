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
// Usage: node s3rver_strict.js DATA_DIR PORT BUCKET   (PORT 0 picks one)
// Prints "listening PORT" on stdout once it accepts connections.
'use strict';
const path = require('path');
const crypto = require('crypto');
const S3rver = require(path.join(__dirname, 'node', 'node_modules', 's3rver'));

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
  return next();
}

const server = new S3rver({
  address: '127.0.0.1',
  port: Number(port),
  directory: dataDir,
  silent: true,
  configureBuckets: bucket ? [{ name: bucket, configs: [] }] : [],
});
server.middleware.unshift(verify);
server.run().then(({ port: p }) => console.log(`listening ${p}`)).catch(err => {
  console.error(err);
  process.exit(1);
});
