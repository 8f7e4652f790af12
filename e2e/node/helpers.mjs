// Helpers shared by the openid-client suites (*.test.mjs): the server under
// test from the environment, a recording fetch, and small request helpers.
import assert from 'node:assert/strict'
import * as client from 'openid-client'

export const ISSUER = process.env.IDENTITYD_ISSUER
export const ADMIN_ID = process.env.IDENTITYD_ADMIN_CLIENT_ID
export const ADMIN_SECRET = process.env.IDENTITYD_ADMIN_CLIENT_SECRET

export const BASE = (ISSUER ?? '').replace(/\/+$/, '')

// RFC 6749 §2.3.1: id and secret are form-urlencoded before Basic encoding.
export const formEncode = (s) => encodeURIComponent(s).replace(/%20/g, '+')
export const basic = (id, secret) =>
  'Basic ' + Buffer.from(`${formEncode(id)}:${formEncode(secret)}`).toString('base64')

// A fetch that records every request and the raw JSON of every response, so
// that tests can see what the library sent and what the server really said
// (openid-client lower-cases token_type, for instance).
export function recorder() {
  const calls = []
  const fn = async (url, options) => {
    const res = await fetch(url, options)
    const call = {
      url: String(url),
      method: options.method,
      headers: new Headers(options.headers),
      body: options.body === undefined ? undefined : String(options.body),
      status: res.status,
      json: undefined,
    }
    try {
      call.json = await res.clone().json()
    } catch {}
    calls.push(call)
    return res
  }
  return { fn, calls, last: () => calls.at(-1) }
}

// A Configuration for one client and one authentication method, with a recorder.
export function configFor(serverMetadata, clientId, secret, method = 'basic') {
  const auth =
    method === 'post' ? client.ClientSecretPost(secret) : client.ClientSecretBasic(secret)
  const config = new client.Configuration(serverMetadata, clientId, secret, auth)
  client.allowInsecureRequests(config)
  const rec = recorder()
  config[client.customFetch] = rec.fn
  return { config, rec }
}

// Awaits a promise that must reject with an OAuth error response; returns
// { kind, status, error, description, challenges, err }. oauth4webapi throws ResponseBodyError for an error body,
// or WWWAuthenticateChallengeError (before reading the body) when the server
// also sends WWW-Authenticate, as RFC 6749 §5.2 asks for a failed Basic auth.
export async function oauthError(promise) {
  let err
  try {
    await promise
  } catch (e) {
    err = e
  }
  assert.ok(err, 'expected an OAuth error response, the request succeeded')
  if (err instanceof client.ResponseBodyError) {
    return { kind: 'body', status: err.status, error: err.error, description: err.error_description, err }
  }
  if (err instanceof client.WWWAuthenticateChallengeError) {
    let body
    try {
      body = await err.response.json()
    } catch {}
    return { kind: 'challenge', status: err.status, error: body?.error, description: body?.error_description, challenges: err.cause, err }
  }
  throw err
}

export async function api(method, path, token, body) {
  const headers = { accept: 'application/json' }
  if (token) headers.authorization = `Bearer ${token}`
  if (body !== undefined) headers['content-type'] = 'application/json'
  const res = await fetch(BASE + path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await res.text()
  let json
  try {
    json = text ? JSON.parse(text) : undefined
  } catch {}
  return { status: res.status, headers: res.headers, json, text }
}

// An admin access token: client credentials with plain fetch and HTTP Basic,
// as the bootstrap admin. Returns the whole token response.
export async function adminGrant() {
  assert.ok(ADMIN_ID && ADMIN_SECRET, 'IDENTITYD_ADMIN_CLIENT_ID/SECRET must be set')
  const res = await fetch(`${BASE}/api/v1/oauth/token`, {
    method: 'POST',
    headers: {
      authorization: basic(ADMIN_ID, ADMIN_SECRET),
      'content-type': 'application/x-www-form-urlencoded',
      accept: 'application/json',
    },
    body: new URLSearchParams({ grant_type: 'client_credentials' }),
  })
  const text = await res.text()
  assert.equal(res.status, 200, `admin token: ${text}`)
  const body = JSON.parse(text)
  assert.equal(typeof body.access_token, 'string')
  return body
}
