package handlers

import (
	"net/http"
	"strings"
	"testing"
)

func TestParseIntent(t *testing.T) {
	ok := http.Header{}
	ok.Set(hTaskID, "task-1:a/b")
	ok.Set(hChainID, "chain.7")
	ok.Set(hParentTask, "task-0")
	ok.Set(hAction, "lookup_user")
	ok.Set(hReason, "the user asked: find Ana (ticket #4)")
	ok.Set(hInitiator, "user:42 via chat")
	ok.Set(hDepth, "3")
	in, err := parseIntent(ok)
	if err != nil || *in.TaskID != "task-1:a/b" || *in.Depth != 3 || *in.Reason != "the user asked: find Ana (ticket #4)" {
		t.Fatalf("%+v %v", in, err)
	}
	if in, err := parseIntent(http.Header{}); err != nil || in.TaskID != nil || in.Depth != nil {
		t.Fatalf("no headers: %+v %v", in, err)
	}
	for _, c := range []struct{ header, value string }{
		{hDepth, "-1"}, {hDepth, "abc"}, {hDepth, "1001"}, {hDepth, "1.5"}, {hDepth, ""}, {hDepth, "00001"},
		{hTaskID, "has space"}, {hTaskID, strings.Repeat("a", 129)}, {hChainID, "é"}, {hParentTask, "a;b"},
		{hAction, "drop table"}, {hReason, "line\nbreak"}, {hInitiator, strings.Repeat("x", 257)},
		{hReason, "r\xff"}, {hInitiator, "\xc3\x28"}, {hTaskID, "\xff"}, {hReason, "nul\x00"},
	} {
		h := http.Header{}
		h.Set(c.header, c.value)
		if _, err := parseIntent(h); err == nil || !strings.Contains(err.Error(), c.header) {
			t.Errorf("%s: %q accepted (%v)", c.header, c.value, err)
		}
	}
	twice := http.Header{}
	twice.Add(hTaskID, "a")
	twice.Add(hTaskID, "b")
	if _, err := parseIntent(twice); err == nil {
		t.Error("a header sent twice was accepted")
	}
}
