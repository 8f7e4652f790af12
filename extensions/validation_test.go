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
