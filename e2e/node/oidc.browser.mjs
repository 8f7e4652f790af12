// OpenID Connect sign-in with openid-client v6, a library nobody on this
// project wrote, and the hosted page filled in Debian's Chromium: the
// authorization code flow with PKCE for a confidential application (RS256
// ID tokens, opaque access tokens) and, in the same browser, single sign-on
// without a page (prompt=none) into a public application (ES256 ID tokens,
// JWT access tokens); refresh with rotation, userinfo, and RP-initiated
// logout, after which the tokens are dead and prompt=none says
// login_required. Run by the Go e2e harness (TestOpenIDClientSignIn), which
// starts the server, registers the applications and the person, and passes
// them in the environment.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createServer } from 'node:http'
import * as client from 'openid-client'
import { chromium } from 'playwright-core'

const env = process.env
const ISSUER = env.IDENTITYD_ISSUER
const REDIRECT_URI = env.REDIRECT_URI
const POST_LOGOUT_URI = env.POST_LOGOUT_URI

let browser, page, callback, web, pub, consoleApp

before(async () => {
  browser = await chromium.launch({ executablePath: env.CHROMIUM, args: ['--no-sandbox'] })
  page = await (await browser.newContext()).newPage()
  callback = createServer((req, res) => {
    res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' })
    res.end('<!doctype html><title>App</title><h1>Back at the application</h1>')
  })
  await new Promise((ok) => callback.listen(Number(env.CALLBACK_PORT), '127.0.0.1', ok))
  const insecure = { execute: [client.allowInsecureRequests] }
  web = await client.discovery(new URL(ISSUER), env.WEB_CLIENT_ID, undefined, client.ClientSecretBasic(env.WEB_CLIENT_SECRET), insecure)
  consoleApp = await client.discovery(new URL(ISSUER), env.CONSOLE_CLIENT_ID, undefined, client.ClientSecretBasic(env.CONSOLE_CLIENT_SECRET), insecure)
  pub = await client.discovery(new URL(ISSUER), env.PUBLIC_CLIENT_ID, { id_token_signed_response_alg: 'ES256' }, client.None(), insecure)
})

after(async () => {
  await browser?.close()
  await new Promise((ok) => callback?.close(ok))
})

// authorize sends the browser to the authorization endpoint with PKCE,
// state and nonce, lets fill() handle any page, and answers the callback URL
// the application received.
async function authorize(config, extra, fill) {
  const verifier = client.randomPKCECodeVerifier()
  const state = client.randomState()
  const nonce = client.randomNonce()
  const url = client.buildAuthorizationUrl(config, {
    redirect_uri: REDIRECT_URI, scope: 'openid email profile offline_access roles', state, nonce,
    code_challenge: await client.calculatePKCECodeChallenge(verifier), code_challenge_method: 'S256', ...extra,
  })
  await page.goto(url.href)
  if (fill) await fill()
  await page.waitForURL((u) => u.toString().startsWith(REDIRECT_URI))
  return { callbackUrl: new URL(page.url()), verifier, state, nonce }
}

async function signIn() {
  await page.getByLabel('Email').fill(env.EMAIL)
  await page.getByRole('button', { name: 'Continue' }).click()
  await page.getByLabel('Password').fill(env.PASSWORD)
  await page.getByRole('button', { name: 'Sign in' }).click()
}

let webTokens, pubTokens

test('authorization code + PKCE on the hosted page: ID token, access and refresh tokens', async () => {
  const a = await authorize(web, { login_hint: env.EMAIL }, signIn)
  assert.equal(a.callbackUrl.searchParams.get('iss'), ISSUER) // RFC 9207, checked by the library too
  webTokens = await client.authorizationCodeGrant(web, a.callbackUrl, {
    pkceCodeVerifier: a.verifier, expectedState: a.state, expectedNonce: a.nonce, idTokenExpected: true,
  })
  const claims = webTokens.claims()
  assert.equal(claims.iss, ISSUER)
  assert.deepEqual([].concat(claims.aud), [env.WEB_CLIENT_ID])
  assert.equal(claims.sub, env.USER_ID)
  assert.equal(claims.email, env.EMAIL)
  assert.equal(claims.name, 'Ada Lovelace')
  assert.deepEqual([...claims.roles].sort(), ['admin', 'editor'])
  assert.ok(claims.sid && claims.auth_time && claims.at_hash, JSON.stringify(claims))
  assert.deepEqual(claims.amr, ['pwd'])
  assert.ok(webTokens.refresh_token, 'offline_access gives a refresh token')
  const [header] = webTokens.id_token.split('.')
  assert.equal(JSON.parse(Buffer.from(header, 'base64url')).alg, 'RS256')
})

test('a second application signs the same person in without a page (prompt=none)', async () => {
  const a = await authorize(pub, { prompt: 'none', id_token_hint: webTokens.id_token })
  pubTokens = await client.authorizationCodeGrant(pub, a.callbackUrl, {
    pkceCodeVerifier: a.verifier, expectedState: a.state, expectedNonce: a.nonce, idTokenExpected: true,
  })
  const claims = pubTokens.claims()
  assert.equal(claims.sub, env.USER_ID)
  assert.equal(claims.sid, webTokens.claims().sid)
  assert.deepEqual([].concat(claims.aud), [env.PUBLIC_CLIENT_ID])
  const [header, payload] = pubTokens.access_token.split('.')
  assert.equal(JSON.parse(Buffer.from(header, 'base64url')).typ, 'at+jwt') // RFC 9068
  assert.equal(JSON.parse(Buffer.from(payload, 'base64url')).client_id, env.PUBLIC_CLIENT_ID)
})

test('userinfo answers the claims of the scopes', async () => {
  const info = await client.fetchUserInfo(web, webTokens.access_token, env.USER_ID)
  assert.equal(info.email, env.EMAIL)
  assert.equal(info.email_verified, false)
  assert.equal(info.name, 'Ada Lovelace')
})

test('refresh rotates the refresh token; the rotated one, used again, revokes the family', async () => {
  const first = webTokens.refresh_token
  const next = await client.refreshTokenGrant(web, first)
  assert.notEqual(next.refresh_token, first)
  assert.equal(next.claims().sub, env.USER_ID)
  await assert.rejects(client.refreshTokenGrant(web, first), (e) => e.error === 'invalid_grant')
  await assert.rejects(client.refreshTokenGrant(web, next.refresh_token), (e) => e.error === 'invalid_grant')
  await assert.rejects(client.fetchUserInfo(web, next.access_token, env.USER_ID))
})

// api calls identityd's API with a bearer token.
async function api(method, path, token, body) {
  const res = await fetch(`${ISSUER}${path}`, {
    method, headers: { authorization: `Bearer ${token}`, ...(body ? { 'content-type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  })
  return { status: res.status, json: await res.json().catch(() => null) }
}

test('a console administrator acts as admin through an adminConsole application only', async () => {
  const a = await authorize(consoleApp, { prompt: 'none' })
  const t = await client.authorizationCodeGrant(consoleApp, a.callbackUrl, { pkceCodeVerifier: a.verifier, expectedState: a.state, expectedNonce: a.nonce })
  const me = await api('GET', '/api/v1/m2m/whoami', t.access_token)
  assert.equal(me.status, 200)
  assert.equal(me.json.type, 'user')
  assert.equal(me.json.id, env.USER_ID)
  assert.equal((await api('GET', '/api/v1/service-accounts', t.access_token)).status, 200)
  assert.equal((await api('GET', '/api/v1/service-accounts', pubTokens.access_token)).status, 403) // the same person through another application
  const taken = await api('DELETE', `/api/v1/m2m/users/${env.USER_ID}/console-admin`, env.ADMIN_TOKEN)
  assert.equal(taken.status, 200, JSON.stringify(taken.json))
  assert.equal(taken.json.consoleAdmin, false)
  assert.equal((await api('GET', '/api/v1/service-accounts', t.access_token)).status, 403) // read at the call
})

test('RP-initiated logout ends the session and its tokens', async () => {
  const state = client.randomState()
  const url = client.buildEndSessionUrl(pub, { id_token_hint: pubTokens.id_token, post_logout_redirect_uri: POST_LOGOUT_URI, state })
  await page.goto(url.href)
  await page.waitForURL((u) => u.toString().startsWith(POST_LOGOUT_URI))
  assert.equal(new URL(page.url()).searchParams.get('state'), state)
  await assert.rejects(client.refreshTokenGrant(pub, pubTokens.refresh_token), (e) => e.error === 'invalid_grant')
  const a = await authorize(web, { prompt: 'none' })
  assert.equal(a.callbackUrl.searchParams.get('error'), 'login_required')
  assert.equal(a.callbackUrl.searchParams.get('iss'), ISSUER)
})

test('an invited person follows the link, signs in with login_hint, and the application accepts the invite', async () => {
  const context = await browser.newContext() // another browser: no session
  const p = await context.newPage()
  await p.goto(env.INVITE_LINK)
  await p.waitForURL((u) => u.toString().startsWith(env.INVITE_ACCEPT_URI))
  const landing = new URL(p.url()).searchParams
  assert.equal(landing.get('email'), env.INVITE_EMAIL)
  assert.equal(landing.get('user_exists'), 'true')
  const verifier = client.randomPKCECodeVerifier()
  const state = client.randomState()
  const url = client.buildAuthorizationUrl(web, {
    redirect_uri: REDIRECT_URI, scope: 'openid email', state, login_hint: landing.get('email'),
    code_challenge: await client.calculatePKCECodeChallenge(verifier), code_challenge_method: 'S256',
  })
  await p.goto(url.href)
  assert.equal(await p.getByLabel('Email').inputValue(), env.INVITE_EMAIL) // pre-filled
  await p.getByRole('button', { name: 'Continue' }).click()
  await p.getByLabel('Password').fill(env.PASSWORD)
  await p.getByRole('button', { name: 'Sign in' }).click()
  await p.waitForURL((u) => u.toString().startsWith(REDIRECT_URI))
  const tokens = await client.authorizationCodeGrant(web, new URL(p.url()), { pkceCodeVerifier: verifier, expectedState: state })
  assert.equal(tokens.claims().email, env.INVITE_EMAIL)
  const accepted = await api('POST', `/api/v1/m2m/invites/${landing.get('invite_token')}/accept`, env.INVITER_TOKEN)
  assert.equal(accepted.status, 200, JSON.stringify(accepted.json))
  await context.close()
})
