package handlers

import (
	"cmp"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/identityd/identityd/persistence"
)

// Account linking (spec paths): a person adds a sign-in method to their
// account by proving it is theirs (initiate, verify), lists the methods and
// removes one with their own token. Rules in extensions/signin/link.go.
const (
	linkVerifyPath     = "/api/v1/auth/link/verify"
	linkIdentitiesPath = "/api/v1/auth/link/identities"
	linkProviderPath   = "/api/v1/auth/link/{provider}"
)

// linkRoutes registers the linking routes. Initiate and verify are public:
// each request counts against rl.Link per address, initiates against
// rl.LinkEmail per e-mail address from addresses that already used theirs
// (failureLimit: a stranger cannot use up a person's), and wrong proofs
// against the token (signin.MaxLinkAttempts). A person's own routes count
// against rl.SignIn per person.
func (a *api) linkRoutes(r *mux.Router, rl RateLimits) {
	r.HandleFunc(LinkingPath, a.linkInitiate).Methods(http.MethodPost)
	r.HandleFunc(linkVerifyPath, a.linkVerify).Methods(http.MethodPost)
	if a.upstream != nil { // the hosted linking step (linkpage.go): the upstream sign-in's offer, and the proof
		r.HandleFunc(LinkPagePath, a.signinLimited(a.linkPage)).Methods(http.MethodPost)
		r.HandleFunc(linkVerifyPagePath, a.signinLimited(a.linkPageVerify)).Methods(http.MethodPost)
	}
	self := func(h http.HandlerFunc) http.HandlerFunc {
		return a.authenticated("", "", a.personal(a.limited("link-self", rl.SignIn, byPerson, h)))
	}
	r.HandleFunc(linkIdentitiesPath, self(a.linkIdentities)).Methods(http.MethodGet)
	r.HandleFunc(linkProviderPath, self(a.recent(a.unlink))).Methods(http.MethodDelete)
}

// POST /api/v1/auth/link/initiate {"email", "newProvider", "clientId"}
func (a *api) linkInitiate(w http.ResponseWriter, r *http.Request) {
	if a.links.refused(w, r, writeRateLimited) {
		return
	}
	var b struct {
		Email       string `json:"email"`
		NewProvider string `json:"newProvider"`
		ClientID    string `json:"clientId"`
		PendingLink string `json:"pendingLink"` // an upstream sign-in's, from its 409 account_exists
	}
	if err := cmp.Or(decodeJSON(r, &b), required("email", b.Email, "newProvider", b.NewProvider, "clientId", b.ClientID)); err != nil {
		writeError(w, r, err)
		return
	}
	email := emailKey(b.Email)
	if a.links.refusedAs(w, r, email, writeRateLimited) {
		return
	}
	a.links.failedAs(r, email) // every initiate is an attempt
	app, err := a.signin.Application(r.Context(), b.ClientID)
	if err != nil {
		writeError(w, r, err)
		return
	}
	var pending *persistence.UpstreamLink
	if b.PendingLink != "" && a.upstream != nil {
		if pending, err = a.upstream.PendingLink(r.Context(), b.PendingLink); err != nil {
			writeError(w, r, err)
			return
		}
	}
	start, err := a.signin.InitiateLink(r.Context(), app, b.Email, b.NewProvider, pending, requestClient(r))
	if err != nil {
		writeError(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	message := "Enter the account's password to link " + b.NewProvider + "."
	if start.Verification != persistence.VerifyPassword {
		message = "A code was sent to the account's e-mail address; enter it to link " + b.NewProvider + "."
	}
	writeJSON(w, http.StatusOK, map[string]any{"linkingToken": start.Token, "verificationRequired": start.Verification,
		"existingIdentities": start.Existing, "message": message})
}

// POST /api/v1/auth/link/verify {"linkingToken", "verification": {"password"} or {"code"}}
func (a *api) linkVerify(w http.ResponseWriter, r *http.Request) {
	if a.links.refused(w, r, writeRateLimited) {
		return
	}
	var b struct {
		LinkingToken string `json:"linkingToken"`
		Verification *struct {
			Password string `json:"password"`
			Code     string `json:"code"`
		} `json:"verification"`
	}
	if err := cmp.Or(decodeJSON(r, &b), required("linkingToken", b.LinkingToken)); err != nil {
		writeError(w, r, err)
		return
	}
	if b.Verification == nil || (b.Verification.Password == "") == (b.Verification.Code == "") {
		writeError(w, r, newError(http.StatusBadRequest, "invalid_request", "verification must hold either password or code.", nil))
		return
	}
	linked, err := a.signin.VerifyLink(r.Context(), b.LinkingToken, b.Verification.Password, b.Verification.Code, requestClient(r))
	if err != nil {
		a.links.failed(r)
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "userId": linked.UserID, "linkedProvider": linked.Provider,
		"message": linked.Provider + " now signs in to the account."})
}

// GET /api/v1/auth/link/identities: the person's sign-in methods.
func (a *api) linkIdentities(w http.ResponseWriter, r *http.Request) {
	p := principalFrom(r.Context())
	user, err := a.directory.GetUser(r.Context(), p.Subject)
	if err != nil {
		writeError(w, r, err)
		return
	}
	ids, err := a.signin.Identities(r.Context(), p.Subject)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"identities": ids, "email": user.Email})
}

// DELETE /api/v1/auth/link/{provider}: removes a method, not the last.
func (a *api) unlink(w http.ResponseWriter, r *http.Request) {
	p := principalFrom(r.Context())
	provider := mux.Vars(r)["provider"]
	remaining, err := a.signin.Unlink(r.Context(), p.Client, p.Subject, provider, requestClient(r))
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "unlinkedProvider": provider, "remainingIdentities": remaining})
}
