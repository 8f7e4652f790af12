// The hosted page's passkey: shows the passkey button where the browser
// speaks WebAuthn, offers the browser's passkeys in the e-mail field's
// autofill where it can (conditional mediation), and posts the credential
// the browser answers, as JSON in the form's credential field, to the
// server, which verifies it and moves the sign-in on. Without this script
// (or WebAuthn) the button stays hidden and the page works as before.
'use strict'
;(() => {
  const form = document.getElementById('passkey-form')
  if (!form || !window.PublicKeyCredential || !navigator.credentials) return
  const button = document.getElementById('passkey-button')
  const problem = document.getElementById('passkey-error')
  const or = document.getElementById('passkey-or')

  const bytes = (s) => Uint8Array.from(atob(s.replace(/-/g, '+').replace(/_/g, '/')), (c) => c.charCodeAt(0))
  const text = (buf) => btoa(String.fromCharCode(...new Uint8Array(buf))).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '')

  // say shows a refusal beside the button (role=alert: it is read out).
  function say(message) {
    problem.textContent = message
    problem.hidden = !message
    if (message) button.setAttribute('aria-describedby', 'passkey-error')
    else button.removeAttribute('aria-describedby')
  }

  // options asks the server for a new ceremony: the options of
  // navigator.credentials.get, its binary fields decoded.
  async function options() {
    const res = await fetch(form.dataset.options, {
      method: 'POST', credentials: 'same-origin', headers: { Accept: 'application/json' },
      body: new URLSearchParams(new FormData(form)),
    })
    if (!res.ok) throw new Error(`options: ${res.status}`)
    const { publicKey } = (await res.json()).options
    publicKey.challenge = bytes(publicKey.challenge)
    for (const c of publicKey.allowCredentials || []) c.id = bytes(c.id)
    return publicKey
  }

  // submit posts the assertion (WebAuthn's JSON form of it).
  function submit(cred) {
    const r = cred.response
    form.elements.credential.value = JSON.stringify({
      id: cred.id, rawId: text(cred.rawId), type: cred.type, authenticatorAttachment: cred.authenticatorAttachment || undefined,
      response: {
        clientDataJSON: text(r.clientDataJSON), authenticatorData: text(r.authenticatorData), signature: text(r.signature),
        userHandle: r.userHandle ? text(r.userHandle) : undefined,
      },
      clientExtensionResults: cred.getClientExtensionResults(),
    })
    button.disabled = true
    form.submit()
  }

  // The e-mail field's autofill: a request that waits until the person
  // picks a passkey there, or the button replaces it.
  let waiting
  async function autofill() {
    if (!form.dataset.conditional || !PublicKeyCredential.isConditionalMediationAvailable) return
    if (!(await PublicKeyCredential.isConditionalMediationAvailable())) return
    const abort = new AbortController()
    const done = (async () => {
      try {
        const cred = await navigator.credentials.get({ mediation: 'conditional', publicKey: await options(), signal: abort.signal })
        if (cred && !abort.signal.aborted) submit(cred)
      } catch {
        // Replaced by the button, or no passkey picked: the page stays.
      }
    })()
    waiting = { abort, done }
  }

  button.addEventListener('click', async () => {
    button.disabled = true
    say('')
    if (waiting) {
      // One request at a time: the autofill's ends before the button's.
      waiting.abort.abort()
      await waiting.done
      waiting = undefined
    }
    try {
      const cred = await navigator.credentials.get({ publicKey: await options() })
      if (cred) return submit(cred)
    } catch {
      // Cancelled, timed out, or no passkey here: said below.
    }
    button.disabled = false
    say('The passkey could not be used. Try again, or sign in another way.')
    button.focus()
    autofill()
  })

  button.hidden = false
  if (or) or.hidden = false
  if (problem.textContent.trim() || form.dataset.only) {
    button.focus() // the step's one way on, or after a refusal: try again from here (the autofill waits for that)
  }
  if (!problem.textContent.trim()) autofill()
})()
