// Passkeys in Debian's Chromium, driven by playwright-core, with CDP
// virtual authenticators (WebAuthn.addVirtualAuthenticator: ctap2,
// internal or usb, resident keys, user verification): run by the Go e2e
// harness (TestBrowserPasskeys), which starts identityd as
// http://localhost:PORT, registers the applications (rpId localhost, the
// web origin of this suite's application page) and the people, with
// ceremonies that live PASSKEY_TIMEOUT_MS. The application's page
// (http://localhost:APP_PORT) calls identityd's passkey API cross-origin
// with a person's token from a hosted password sign-in; a stranger's page
// (http://localhost:OTHER_PORT) is on no application's list. With
// SCREENS_DIR set, the hosted passkey steps are photographed on a desktop
// and a phone viewport.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createServer } from 'node:http'
import { createHash, generateKeyPairSync, randomBytes } from 'node:crypto'
import * as client from 'openid-client'
import { chromiumSuite, focused, shot, startsAt, viewports } from './browser.mjs'

const env = process.env
const ISSUER = env.IDENTITYD_ISSUER
const REDIRECT_URI = env.REDIRECT_URI
const APP_ORIGIN = `http://localhost:${env.APP_PORT}`
const OTHER_ORIGIN = `http://localhost:${env.OTHER_PORT}`
const MULTI_FACTOR = 'http://schemas.openid.net/pape/policies/2007/06/multi-factor'

const chromiumBrowser = chromiumSuite()

// The application's page: identityd's passkey API and WebAuthn, for
// page.evaluate (window.acme).
const APP_JS = `
const API = document.body.dataset.issuer + '/api/v1/auth/webauthn'
window.acme = {
  async call(method, path, body, token) {
    const headers = { 'Content-Type': 'application/json' }
    if (token) headers.Authorization = 'Bearer ' + token
    const res = await fetch(API + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) })
    const text = await res.text()
    return { status: res.status, body: text ? JSON.parse(text) : null }
  },
  async create(options) {
    const cred = await navigator.credentials.create({ publicKey: PublicKeyCredential.parseCreationOptionsFromJSON(options.publicKey) })
    return cred.toJSON()
  },
  async get(options, change) {
    const publicKey = PublicKeyCredential.parseRequestOptionsFromJSON({ ...options.publicKey, ...change })
    const cred = await navigator.credentials.get({ publicKey })
    return cred.toJSON()
  },
}
`

let pages // the application's and the stranger's page servers
before(async () => {
  pages = [env.APP_PORT, env.OTHER_PORT].map((port) => {
    const srv = createServer((req, res) => {
      if (req.url === '/app.js') {
        res.writeHead(200, { 'content-type': 'text/javascript; charset=utf-8' })
        return res.end(APP_JS)
      }
      res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' })
      res.end(`<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Acme Notes</title><script src="/app.js" defer></script></head>` +
        `<body data-issuer="${ISSUER}"><h1>Acme Notes</h1></body></html>`)
    })
    srv.listen(Number(port), '127.0.0.1')
    const srv6 = createServer(srv.listeners('request')[0]) // the browser may try [::1] for localhost
    srv6.on('error', () => {})
    srv6.listen(Number(port), '::1')
    return [srv, srv6]
  }).flat()
})
after(async () => {
  for (const srv of pages) srv.close()
})

// authenticator adds a virtual authenticator to page (internal: the
// computer's own; usb: a security key).
async function authenticator(page, options = {}) {
  const cdp = await page.context().newCDPSession(page)
  await cdp.send('WebAuthn.enable', { enableUI: false })
  const { authenticatorId } = await cdp.send('WebAuthn.addVirtualAuthenticator', {
    options: {
      protocol: 'ctap2', transport: 'internal', hasResidentKey: true, hasUserVerification: true, isUserVerified: true,
      automaticPresenceSimulation: true, ...options,
    },
  })
  return { cdp, authenticatorId }
}

function authorization(clientId) {
  const verifier = randomBytes(32).toString('base64url')
  const state = randomBytes(16).toString('base64url')
  const nonce = randomBytes(16).toString('base64url')
  const url = new URL(`${ISSUER}/api/v1/oauth/authorize`)
  const params = {
    client_id: clientId, redirect_uri: REDIRECT_URI, response_type: 'code', scope: 'openid email profile',
    state, nonce, code_challenge: createHash('sha256').update(verifier).digest('base64url'), code_challenge_method: 'S256',
  }
  for (const [k, v] of Object.entries(params)) url.searchParams.set(k, v)
  return { url: url.toString(), state, verifier, nonce, clientId }
}

// backAtTheApplication waits for the hosted page's answer and trades its
// code for tokens (openid-client, PKCE).
async function backAtTheApplication(page, auth) {
  await page.waitForURL((u) => u.toString().startsWith(REDIRECT_URI))
  const config = await client.discovery(new URL(ISSUER), auth.clientId, undefined, client.None(), { execute: [client.allowInsecureRequests] })
  return client.authorizationCodeGrant(config, new URL(page.url()), {
    pkceCodeVerifier: auth.verifier, expectedState: auth.state, expectedNonce: auth.nonce, idTokenExpected: true,
  })
}

// passwordSignIn signs email in on the hosted page with the password.
async function passwordSignIn(page, email, clientId = env.CLIENT_ID) {
  const auth = authorization(clientId)
  await page.goto(auth.url)
  await page.getByLabel('Email').fill(email)
  await page.getByRole('button', { name: 'Continue' }).click()
  await page.getByLabel('Password').fill(env.PASSWORD)
  await page.getByRole('button', { name: 'Sign in' }).click()
  return { auth }
}

async function appPage(page, origin = APP_ORIGIN) {
  await page.goto(`${origin}/`)
  await page.waitForFunction(() => window.acme)
}

const call = (page, method, path, body, token) =>
  page.evaluate(([m, p, b, t]) => window.acme.call(m, p, b ?? undefined, t), [method, path, body ?? null, token ?? ''])
const create = (page, options) => page.evaluate((o) => window.acme.create(o), options)
const get = (page, options, change = {}) => page.evaluate(([o, c]) => window.acme.get(o, c), [options, change])

function claimsOf(idToken) {
  return JSON.parse(Buffer.from(idToken.split('.')[1], 'base64url').toString())
}

function refused(answer, what) {
  assert.equal(answer.status, 400, `${what}: ${JSON.stringify(answer)}`)
  assert.equal(answer.body.error, 'passkey_failed', what)
  assert.equal(answer.body.message, 'The passkey could not be verified.', what)
}

// register adds a passkey to the person of token from the application's
// page; answers the begin options, the credential sent and the view.
async function register(page, token, name) {
  const begun = await call(page, 'POST', '/register/begin', { clientId: env.CLIENT_ID, name }, token)
  assert.equal(begun.status, 200, JSON.stringify(begun))
  const credential = await create(page, begun.body.options)
  const done = await call(page, 'POST', '/register/finish', { clientId: env.CLIENT_ID, credential }, token)
  return { begun, credential, done }
}

// The person's desktop: their token, the computer's authenticator holding
// their passkey.
const main = {}

test('register a passkey from the application\'s page; the same credential registered again is refused', async () => {
  const context = await chromiumBrowser().newContext({ viewport: viewports.desktop })
  const page = await context.newPage()
  main.context = context
  main.page = page
  main.auth = await authenticator(page)
  const { auth } = await passwordSignIn(page, env.EMAIL_MAIN)
  main.token = (await backAtTheApplication(page, auth)).access_token

  await appPage(page)
  const { begun, credential, done } = await register(page, main.token, 'Work laptop')
  const pk = begun.body.options.publicKey
  assert.equal(pk.rp.id, 'localhost')
  assert.equal(pk.authenticatorSelection.userVerification, 'required')
  assert.equal(pk.authenticatorSelection.residentKey, 'required')
  assert.equal(done.status, 200, JSON.stringify(done))
  assert.equal(done.body.name, 'Work laptop')
  assert.equal(done.body.deviceType, 'desktop')
  assert.equal(done.body.status, 'active')
  main.passkeyId = done.body.id
  const { credentials } = await main.auth.cdp.send('WebAuthn.getCredentials', { authenticatorId: main.auth.authenticatorId })
  assert.equal(credentials.length, 1)
  assert.equal(credentials[0].rpId, 'localhost')

  // The browser will not make a second one on this authenticator: the
  // options exclude the person's passkeys.
  const again = await call(page, 'POST', '/register/begin', { clientId: env.CLIENT_ID }, main.token)
  assert.equal(again.body.options.publicKey.excludeCredentials.length, 1)
  await assert.rejects(create(page, again.body.options), /InvalidStateError|excluded|already/i)

  // The same credential (its attestation, "none": nothing signs the
  // client data) answering another person's ceremony: refused, the
  // credential id is taken.
  const otherContext = await chromiumBrowser().newContext()
  const otherPage = await otherContext.newPage()
  const other = await passwordSignIn(otherPage, env.EMAIL_OTHER)
  const otherToken = (await backAtTheApplication(otherPage, other.auth)).access_token
  await otherContext.close()
  const theirs = await call(page, 'POST', '/register/begin', { clientId: env.CLIENT_ID }, otherToken)
  assert.equal(theirs.status, 200)
  const clientData = Buffer.from(JSON.stringify({
    type: 'webauthn.create', challenge: theirs.body.options.publicKey.challenge, origin: APP_ORIGIN, crossOrigin: false,
  })).toString('base64url')
  const copy = { ...credential, response: { ...credential.response, clientDataJSON: clientData } }
  refused(await call(page, 'POST', '/register/finish', { clientId: env.CLIENT_ID, credential: copy }, otherToken), 'registered twice')
  const listed = await call(page, 'GET', '/credentials', undefined, otherToken)
  assert.deepEqual(listed.body.credentials, [])
})

// move moves the passkeys of one virtual authenticator to another, their
// counters with them: copies would be clones, whose counters fall behind.
async function move(from, to) {
  const { credentials } = await from.cdp.send('WebAuthn.getCredentials', { authenticatorId: from.authenticatorId })
  await from.cdp.send('WebAuthn.clearCredentials', { authenticatorId: from.authenticatorId })
  for (const credential of credentials) await to.cdp.send('WebAuthn.addCredential', { authenticatorId: to.authenticatorId, credential })
}

// device is a context on viewport holding the person's passkey (lend it
// back with done). autofill false: a browser without conditional
// mediation, whose page waits for the button (Chromium's virtual
// authenticator answers a conditional request at once, as a person
// picking the passkey in the e-mail field's autofill).
async function device(viewport, { autofill = false } = {}) {
  const context = await chromiumBrowser().newContext({ viewport: { width: viewport.width, height: viewport.height }, ...viewport })
  if (!autofill) await context.addInitScript(() => { PublicKeyCredential.isConditionalMediationAvailable = async () => false })
  const page = await context.newPage()
  const auth = await authenticator(page)
  await move(main.auth, auth)
  const done = async () => {
    await move(auth, main.auth)
    await context.close()
  }
  return { context, page, auth, done }
}

test('the hosted page\'s e-mail field offers the passkey (autofill): picked, the person is signed in', async () => {
  const { page, done } = await device(viewports.desktop, { autofill: true })
  try {
    const signIn = authorization(env.CLIENT_ID)
    // The virtual authenticator answers the autofill's request at once: the
    // page may be gone before its body could be read, so the field's
    // autocomplete is checked by the button test; here, that it signs in.
    await page.goto(signIn.url)
    const claims = (await backAtTheApplication(page, signIn)).claims() // no click: the autofill's request was answered
    assert.equal(claims.email, env.EMAIL_MAIN)
    assert.deepEqual(claims.amr, ['hwk', 'user', 'mfa'])
  } finally {
    await done() // the passkey goes back to the main authenticator whatever happened
  }
})

for (const [name, viewport] of Object.entries(viewports)) {
  test(`${name}: the hosted page's "Sign in with a passkey" (discoverable), and a passkey it does not know refused`, async (t) => {
    const { context, page, auth, done } = await device(viewport)
    t.after(done) // the passkey goes back to the main authenticator whatever happens
    const signIn = authorization(env.CLIENT_ID)
    const first = await page.goto(signIn.url)
    const csp = first.headers()['content-security-policy']
    assert.match(csp, /^default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'self';/)
    assert.doesNotMatch(csp, /unsafe/)
    const button = page.getByRole('button', { name: 'Sign in with a passkey' })
    await button.waitFor()
    assert.equal(await page.getByLabel('Email').getAttribute('autocomplete'), 'username webauthn')
    await startsAt(page, 'email')
    await shot(page, `passkey-${name}-1-email-step`)
    if (name === 'desktop') {
      // Keyboard only: past Continue to the button, Enter.
      await page.keyboard.press('Tab')
      await page.keyboard.press('Tab')
      assert.equal(await page.evaluate(() => document.activeElement?.id), 'passkey-button')
      await page.keyboard.press('Enter')
    } else {
      await button.tap()
    }
    const claims = (await backAtTheApplication(page, signIn)).claims()
    assert.equal(claims.email, env.EMAIL_MAIN)
    assert.deepEqual(claims.amr, ['hwk', 'user', 'mfa'])
    assert.equal(claims.acr, MULTI_FACTOR)

    // A passkey the server never registered: refused on the page, said
    // beside the button, which has the focus again.
    await move(auth, main.auth)
    await auth.cdp.send('WebAuthn.addCredential', {
      authenticatorId: auth.authenticatorId,
      credential: {
        credentialId: randomBytes(16).toString('base64'), isResidentCredential: true, rpId: 'localhost', signCount: 0,
        privateKey: generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey.export({ type: 'pkcs8', format: 'der' }).toString('base64'),
        userHandle: Buffer.from('someone-else').toString('base64'),
      },
    })
    await context.clearCookies()
    await page.goto(authorization(env.CLIENT_ID).url)
    await page.getByRole('button', { name: 'Sign in with a passkey' }).click()
    const alert = page.locator('#passkey-error')
    await alert.waitFor()
    assert.equal((await alert.textContent()).trim(), 'The passkey could not be verified.')
    assert.equal(await page.getByRole('button', { name: 'Sign in with a passkey' }).getAttribute('aria-describedby'), 'passkey-error')
    await focused(page, 'passkey-button')
    await shot(page, `passkey-${name}-2-refused`)
    await auth.cdp.send('WebAuthn.clearCredentials', { authenticatorId: auth.authenticatorId })
  })
}

for (const [name, viewport] of Object.entries(viewports)) {
  test(`${name}: a passkey as the second factor after a password (Acme Vault requires one)`, async (t) => {
    const { page, done } = await device(viewport)
    t.after(done)
    const { auth } = await passwordSignIn(page, env.EMAIL_MAIN, env.VAULT_CLIENT_ID)
    await page.getByRole('heading', { name: 'Two-step verification' }).waitFor()
    const button = page.getByRole('button', { name: 'Use a passkey' })
    await button.waitFor()
    assert.equal(await page.getByLabel('Code').count(), 0) // a passkey is the only factor this application takes
    await focused(page, 'passkey-button') // the step's one way on has the focus
    await shot(page, `passkey-${name}-3-second-factor`)
    await button.click()
    const claims = (await backAtTheApplication(page, auth)).claims()
    assert.deepEqual(claims.amr, ['pwd', 'hwk', 'user', 'mfa'])
    assert.equal(claims.acr, MULTI_FACTOR)
  })
}

test('without JavaScript the e-mail step works as before and shows no passkey button', async () => {
  const context = await chromiumBrowser().newContext({ javaScriptEnabled: false })
  const page = await context.newPage()
  const { auth } = await passwordSignIn(page, env.EMAIL_MAIN)
  await backAtTheApplication(page, auth)
  await context.clearCookies()
  await page.goto(authorization(env.CLIENT_ID).url)
  await page.getByLabel('Email').waitFor()
  assert.equal(await page.locator('#passkey-button').count(), 1)
  assert.equal(await page.locator('#passkey-button').isVisible(), false)
  await context.close()
})

test('sign in through the API from the application\'s page: discoverable, e-mail first; a replay, a reused and an expired challenge refused', async () => {
  const { page } = main
  await appPage(page)
  const begin = (body = {}) => call(page, 'POST', '/authenticate/begin', { clientId: env.CLIENT_ID, ...body })
  const finish = (credential) => call(page, 'POST', '/authenticate/finish', { clientId: env.CLIENT_ID, credential })

  let begun = await begin()
  assert.equal(begun.status, 200)
  const pk = begun.body.options.publicKey
  assert.equal(pk.rpId, 'localhost')
  assert.equal(pk.userVerification, 'required')
  assert.equal(pk.timeout, Number(env.PASSKEY_TIMEOUT_MS))
  assert.equal(pk.allowCredentials, undefined)
  const assertion = await get(page, begun.body.options)
  const tokens = await finish(assertion)
  assert.equal(tokens.status, 200, JSON.stringify(tokens))
  assert.ok(tokens.body.access_token && tokens.body.refresh_token)
  const claims = claimsOf(tokens.body.id_token)
  assert.equal(claims.email, env.EMAIL_MAIN)
  assert.deepEqual(claims.amr, ['hwk', 'user', 'mfa'])
  refused(await finish(assertion), 'the same assertion again')

  // E-mail first: the person's passkeys; an unknown address looks alike
  // to a discoverable request.
  begun = await begin({ email: env.EMAIL_MAIN })
  assert.equal(begun.body.options.publicKey.allowCredentials.length, 1)
  assert.equal((await finish(await get(page, begun.body.options))).status, 200)
  const unknown = await begin({ email: 'nobody@example.com' })
  assert.equal(unknown.status, 200)
  assert.equal(unknown.body.options.publicKey.allowCredentials, undefined)

  // One challenge, two assertions: the second finds it used.
  begun = await begin()
  const one = await get(page, begun.body.options)
  const two = await get(page, begun.body.options)
  assert.equal((await finish(one)).status, 200)
  refused(await finish(two), 'a reused challenge')

  // Once the ceremony's time is up: refused.
  begun = await begin()
  await new Promise((resolve) => setTimeout(resolve, Number(env.PASSKEY_TIMEOUT_MS) + 500))
  refused(await finish(await get(page, begun.body.options)), 'an expired challenge')
})

test('refused: an assertion made on a page of another origin, and one without user verification', async () => {
  const { page, auth } = main
  // The stranger's page asks the authenticator (its origin is on the
  // rpId); the application's backend forwards what it answered.
  const strangerPage = await main.context.newPage()
  const strangerAuth = await authenticator(strangerPage)
  await move(auth, strangerAuth)
  await appPage(strangerPage, OTHER_ORIGIN)
  const serverCall = async (path, body) => {
    const res = await fetch(`${ISSUER}/api/v1/auth/webauthn${path}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ clientId: env.CLIENT_ID, ...body }),
    })
    return { status: res.status, body: await res.json() }
  }
  let begun = await serverCall('/authenticate/begin', {})
  const foreign = await get(strangerPage, begun.body.options)
  assert.equal(JSON.parse(Buffer.from(foreign.response.clientDataJSON, 'base64url')).origin, OTHER_ORIGIN)
  refused(await serverCall('/authenticate/finish', { credential: foreign }), 'another origin')
  await move(strangerAuth, auth)
  await strangerPage.close()

  // The authenticator cannot verify its user; the page asked it not to.
  await appPage(page)
  await auth.cdp.send('WebAuthn.setUserVerified', { authenticatorId: auth.authenticatorId, isUserVerified: false })
  begun = await call(page, 'POST', '/authenticate/begin', { clientId: env.CLIENT_ID })
  const unverified = await get(page, begun.body.options, { userVerification: 'discouraged' })
  assert.equal(Buffer.from(unverified.response.authenticatorData, 'base64url')[32] & 0x04, 0) // UV not set
  refused(await call(page, 'POST', '/authenticate/finish', { clientId: env.CLIENT_ID, credential: unverified }), 'no user verification')
  await auth.cdp.send('WebAuthn.setUserVerified', { authenticatorId: auth.authenticatorId, isUserVerified: true })
})

test('list, rename and delete from the application\'s page (a security key added and lost)', async () => {
  const { page } = main
  await appPage(page)
  // A security key, on a page of its own (one authenticator a page).
  const keyPage = await main.context.newPage()
  await authenticator(keyPage, { transport: 'usb' })
  await appPage(keyPage)
  const key = await register(keyPage, main.token, '')
  assert.equal(key.done.status, 200, JSON.stringify(key.done))
  assert.equal(key.done.body.deviceType, 'security-key')
  assert.equal(key.done.body.name, 'Security key')
  await keyPage.close()

  let listed = await call(page, 'GET', '/credentials', undefined, main.token)
  assert.equal(listed.status, 200)
  assert.deepEqual(listed.body.credentials.map((c) => [c.name, c.deviceType, c.status]),
    [['Work laptop', 'desktop', 'active'], ['Security key', 'security-key', 'active']])
  assert.ok(listed.body.credentials[0].lastUsedAt)
  const renamed = await call(page, 'PUT', `/credentials/${main.passkeyId}`, { name: 'Home laptop' }, main.token)
  assert.equal(renamed.status, 200)
  assert.equal(renamed.body.name, 'Home laptop')
  const gone = await call(page, 'DELETE', `/credentials/${key.done.body.id}`, undefined, main.token)
  assert.equal(gone.status, 204)
  listed = await call(page, 'GET', '/credentials', undefined, main.token)
  assert.deepEqual(listed.body.credentials.map((c) => c.name), ['Home laptop'])
  assert.equal((await call(page, 'DELETE', `/credentials/${key.done.body.id}`, undefined, main.token)).status, 404)
  await main.context.close()
})

test('a passkey whose counter went backwards is refused and revoked', async () => {
  const context = await chromiumBrowser().newContext()
  const page = await context.newPage()
  const auth = await authenticator(page)
  const { auth: signIn } = await passwordSignIn(page, env.EMAIL_CLONE)
  const token = (await backAtTheApplication(page, signIn)).access_token
  await appPage(page)
  assert.equal((await register(page, token, 'Phone')).done.status, 200)
  const signInOnce = async () => {
    const begun = await call(page, 'POST', '/authenticate/begin', { clientId: env.CLIENT_ID, email: env.EMAIL_CLONE })
    return call(page, 'POST', '/authenticate/finish', { clientId: env.CLIENT_ID, credential: await get(page, begun.body.options) })
  }
  assert.equal((await signInOnce()).status, 200)
  assert.equal((await signInOnce()).status, 200)
  // A copy of the key from before those sign-ins: its counter is behind.
  const { credentials } = await auth.cdp.send('WebAuthn.getCredentials', { authenticatorId: auth.authenticatorId })
  assert.ok(credentials[0].signCount >= 2)
  await auth.cdp.send('WebAuthn.removeCredential', { authenticatorId: auth.authenticatorId, credentialId: credentials[0].credentialId })
  await auth.cdp.send('WebAuthn.addCredential', { authenticatorId: auth.authenticatorId, credential: { ...credentials[0], signCount: 0 } })
  refused(await signInOnce(), 'a counter that went backwards')
  const listed = await call(page, 'GET', '/credentials', undefined, token)
  assert.equal(listed.body.credentials[0].status, 'revoked')
  // Revoked: even a counter ahead is refused now.
  await auth.cdp.send('WebAuthn.removeCredential', { authenticatorId: auth.authenticatorId, credentialId: credentials[0].credentialId })
  await auth.cdp.send('WebAuthn.addCredential', { authenticatorId: auth.authenticatorId, credential: { ...credentials[0], signCount: 100 } })
  refused(await signInOnce(), 'a revoked passkey')
  await context.close()
})

