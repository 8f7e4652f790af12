package extensions

import (
	"strings"
	"testing"
)

func TestCheckHTTPSURL(t *testing.T) {
	cases := map[string]bool{
		"https://app.example/cb":               true,
		"https://app.example:8443/a?b=c":       true,
		"http://localhost:3000/cb":             true,
		"http://127.0.0.1/cb":                  true,
		"http://[::1]:8080/cb":                 true,
		"http://app.example/cb":                false,
		"https://app.example/cb#frag":          false,
		"https://user:pw@app.example/":         false,
		"/relative":                            false,
		"ftp://app.example/":                   false,
		"javascript:alert(1)":                  false,
		"https://":                             false,
		"https://" + strings.Repeat("a", 2000): false,
	}
	for uri, ok := range cases {
		if err := CheckHTTPSURL(uri); (err == nil) != ok {
			t.Errorf("%q: err %v", uri, err)
		}
	}
}

func TestCheckText(t *testing.T) {
	var v ValidationError
	v.CheckText("a", "  ", true, 10)
	v.CheckText("b", "12345678901", false, 10)
	v.CheckText("c", "bad\x00", false, 10)
	v.CheckText("d", "fine\tline\n", true, 20)
	v.CheckText("e", "", false, 10)
	if len(v.Fields) != 3 || v.Fields["a"] == "" || v.Fields["b"] == "" || v.Fields["c"] == "" {
		t.Fatalf("fields %v", v.Fields)
	}
	if v.Err() == nil || !strings.Contains(v.Error(), "a: is required") {
		t.Fatalf("error %v", v.Err())
	}
	var empty ValidationError
	if empty.Err() != nil {
		t.Fatal("empty validation error is not nil")
	}
}

// Identifiers a person reads to decide refuse control and format
// characters: a bidi override or a zero-width character would make them
// read as something else (issue 39).
func TestCheckIdentifier(t *testing.T) {
	for _, bad := range []string{"users/\u202e24", "users/4\u200b2", "delete\u2066_user", "a\u00adb", "x\ufeff", "tab\there", "line\nbreak", "nul\x00", "del\u007f", "c1\u0085"} {
		var v ValidationError
		v.CheckIdentifier("resource", bad, true, 100)
		if !strings.Contains(v.Fields["resource"], "control or format") && !strings.Contains(v.Fields["resource"], "control characters") {
			t.Errorf("%q: %v", bad, v.Fields)
		}
	}
	for _, good := range []string{"users/42", "delete_user", "orgs/Ünïcödé/ביטוח", "users/😀"} {
		var v ValidationError
		v.CheckIdentifier("resource", good, true, 100)
		if v.Err() != nil {
			t.Errorf("%q: %v", good, v.Fields)
		}
	}
	var v ValidationError
	v.CheckIdentifier("action", "", true, 10)
	if v.Fields["action"] != "is required" {
		t.Errorf("required: %v", v.Fields)
	}
}
