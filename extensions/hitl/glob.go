package hitl

import (
	"errors"
	"unicode/utf8"
)

// Glob is a compiled pattern of a policy: `*` matches any run of characters
// (none included, `/` included), `?` exactly one character, and `\` makes
// the next `*`, `?` or `\` literal; every other character matches itself,
// case-sensitively. Matching walks the pattern once with one backtrack
// point (the last `*`), so it takes at most len(pattern)·len(input) steps.
type Glob struct {
	toks []tok
}

type tok struct {
	kind byte // 'c' a literal character, '?' any one, '*' any run
	r    rune
}

// Errors of CompileGlob.
var (
	errTrailingEscape = errors.New(`ends with a lone \`)
	errBadEscape      = errors.New(`\ may only escape *, ? or \`)
)

// CompileGlob compiles a pattern (see Glob).
func CompileGlob(pattern string) (Glob, error) {
	var g Glob
	rs := []rune(pattern)
	for i := 0; i < len(rs); i++ {
		switch c := rs[i]; c {
		case '*':
			if n := len(g.toks); n > 0 && g.toks[n-1].kind == '*' {
				continue // ** is *
			}
			g.toks = append(g.toks, tok{kind: '*'})
		case '?':
			g.toks = append(g.toks, tok{kind: '?'})
		case '\\':
			if i+1 == len(rs) {
				return Glob{}, errTrailingEscape
			}
			i++
			if rs[i] != '*' && rs[i] != '?' && rs[i] != '\\' {
				return Glob{}, errBadEscape
			}
			g.toks = append(g.toks, tok{kind: 'c', r: rs[i]})
		default:
			g.toks = append(g.toks, tok{kind: 'c', r: c})
		}
	}
	return g, nil
}

// Match tells whether s matches the whole pattern.
func (g Glob) Match(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	in := []rune(s)
	p, i := 0, 0
	star, resume := -1, 0
	for i < len(in) {
		if p < len(g.toks) {
			switch t := g.toks[p]; {
			case t.kind == '*':
				star, resume = p, i
				p++
				continue
			case t.kind == '?' || t.r == in[i]:
				p++
				i++
				continue
			}
		}
		if star < 0 {
			return false
		}
		// Let the last * take one more character and try again from there.
		resume++
		p, i = star+1, resume
	}
	for p < len(g.toks) && g.toks[p].kind == '*' {
		p++
	}
	return p == len(g.toks)
}
