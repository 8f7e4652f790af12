package handlers

import (
	"bytes"
	"crypto/sha256"
	_ "embed" // openapi.json
	"encoding/base64"
	"net/http"
	"time"
)

// openAPIDocument is the OpenAPI 3.1 description of the whole HTTP API,
// written by hand beside the handlers it describes (docs/api.md is its
// readable form). openapi_test.go validates it and fails when a route of
// the router is missing from it, or when it lists one the router lacks.
//
//go:embed openapi.json
var openAPIDocument []byte

// openAPIETag is the document's entity tag: it changes only with a build
// that changes the document.
var openAPIETag = func() string {
	sum := sha256.Sum256(openAPIDocument)
	return `"` + base64.RawURLEncoding.EncodeToString(sum[:12]) + `"`
}()

// GET and HEAD /api/v1/openapi.json: public, like discovery, and cacheable
// for five minutes; a client holding the current copy revalidates with
// If-None-Match (304). net/http answers HEAD, conditional and range
// requests.
func (a *api) openAPI(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "public, max-age=300")
	h.Set("ETag", openAPIETag)
	http.ServeContent(w, r, "openapi.json", time.Time{}, bytes.NewReader(openAPIDocument))
}
