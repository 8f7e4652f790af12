// An application's own sign-in page for identityd's embedded sign-in API,
// as a single-page application writes it: served as a file (no inline
// script) by the application server of the Go e2e test
// (e2e/embedded_browser_test.go), and driven in Chromium by
// embedded.browser.mjs through window.app. The page computes PKCE itself
// (crypto.subtle), calls identityd cross-origin with JSON (so every call is
// preflighted), and hands the authorization code with its verifier to the
// application's backend (POST /session, same origin), which exchanges it.
// A call that the browser refuses (CORS) is reported to the backend
// (POST /report) and answered as { error, message }.
const cfg = document.body.dataset
const API = `${cfg.issuer}/api/v1/embedded/auth`

const b64url = (buf) =>
  btoa(String.fromCharCode(...new Uint8Array(buf))).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '')

// RFC 7636: a 256-bit verifier and its S256 challenge.
async function pkce() {
  const verifier = b64url(crypto.getRandomValues(new Uint8Array(32)))
  const challenge = b64url(await crypto.subtle.digest('SHA-256', new TextEncoder().encode(verifier)))
  return { verifier, challenge }
}

async function call(path, body) {
  const res = await fetch(`${API}/${path}`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ clientId: cfg.clientId, ...body }),
  })
  return { status: res.status, body: await res.json() }
}

async function backend(code, verifier) {
  const res = await fetch('/session', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ code, verifier }),
  })
  return { status: res.status, body: await res.json() }
}

function guarded(step, fn) {
  return async (...args) => {
    try {
      return await fn(...args)
    } catch (e) {
      await fetch('/report', {
        method: 'POST',
        headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ step, name: e.name, message: e.message }),
      })
      return { error: e.name, message: e.message }
    }
  }
}

let pending // the PKCE pair of the sign-in in progress

window.app = {
  // begin starts a sign-in: a fresh PKCE pair; answers the challenge.
  begin: async () => {
    pending = await pkce()
    return pending.challenge
  },
  checkEmail: guarded('check-email', (email) => call('check-email', { email })),
  sendCode: guarded('otp/send', (email) => call('otp/send', { email })),
  // verifyCode trades the e-mailed code for an authorization code bound to
  // the challenge, then lets the backend exchange it with the verifier.
  verifyCode: guarded('otp/verify', async (email, code) => {
    const verified = await call('otp/verify', { email, code, codeChallenge: pending.challenge, codeChallengeMethod: 'S256' })
    if (verified.status !== 200) return { verified }
    return { verified, session: await backend(verified.body.code, pending.verifier) }
  }),
  password: guarded('password', async (email, password) => {
    const signedIn = await call('password', { email, password, codeChallenge: pending.challenge, codeChallengeMethod: 'S256' })
    if (signedIn.status !== 200) return { signedIn }
    return { signedIn, session: await backend(signedIn.body.code, pending.verifier) }
  }),
  // sendLink asks for a magic link back to this application's callback;
  // the verifier waits in localStorage for the page the link leads to.
  sendLink: guarded('magic-link/send', async (email) => {
    localStorage.setItem('pkce-verifier', pending.verifier)
    return call('magic-link/send', {
      email, redirectUri: cfg.redirectUri, codeChallenge: pending.challenge, codeChallengeMethod: 'S256',
    })
  }),
}

// The callback a magic link ends at: ?code=&iss=, exchanged by the backend
// with the verifier kept when the link was asked for.
if (location.pathname === '/callback') {
  const q = new URLSearchParams(location.search)
  const verifier = localStorage.getItem('pkce-verifier')
  localStorage.removeItem('pkce-verifier')
  const result = q.get('code') && verifier ? await backend(q.get('code'), verifier) : { error: 'no code or no verifier' }
  document.getElementById('result').textContent = JSON.stringify({ iss: q.get('iss'), ...result })
}
document.body.dataset.ready = 'true'
