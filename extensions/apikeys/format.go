package apikeys

import (
	"crypto/rand"
	"hash/crc32"
	"math/big"
	"strings"
)

// The key format follows GitHub's token format (github.blog, 2021-04-05,
// "Behind GitHub's new authentication token formats"): a prefix naming the
// issuer and kind, underscores (a double click selects the whole key),
// base62 entropy and a CRC32 checksum in the last six base62 characters,
// so that a secret scanner recognises a real key offline, with few false
// positives, without asking identityd:
//
//	idk_<application tag>_<43 base62: 256 bits from crypto/rand><6 base62: CRC32>
//
// "idk" names identityd keys; the tag is twelve characters of the
// application's client id (lower-case base32), so a leaked key says whose
// it is. The checksum covers everything before it. 66 characters in all;
// the pattern is `idk_[a-z2-7]{12}_[0-9A-Za-z]{49}`.
const (
	Prefix       = "idk_"
	TagLength    = 12
	secretChars  = 43 // 62^43 > 2^256
	checkChars   = 6  // 62^6 > 2^32
	KeyLength    = len(Prefix) + TagLength + 1 + secretChars + checkChars
	base62Digits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
)

// Tag is the application tag of a key: the first TagLength characters of
// the random part of the application's client id ("app_…").
func Tag(appClientID string) string {
	s := strings.TrimPrefix(appClientID, "app_")
	if len(s) > TagLength {
		s = s[:TagLength]
	}
	return s
}

// NewKey makes a key for the application whose tag is tag.
func NewKey(tag string) string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails: crypto/rand crashes the program rather than return short
	body := Prefix + tag + "_" + base62(new(big.Int).SetBytes(b), secretChars)
	return body + checksum(body)
}

// checksum is the CRC32 (IEEE) of s in six base62 digits.
func checksum(s string) string {
	return base62(new(big.Int).SetUint64(uint64(crc32.ChecksumIEEE([]byte(s)))), checkChars)
}

// base62 writes n in width digits, zeros first.
func base62(n *big.Int, width int) string {
	out := make([]byte, width)
	base, mod := big.NewInt(62), new(big.Int)
	for i := width - 1; i >= 0; i-- {
		n.DivMod(n, base, mod)
		out[i] = base62Digits[mod.Int64()]
	}
	return string(out)
}

// WellFormed tells whether s has the key's shape and a checksum that
// matches: what a scanner checks, and what validation checks before any
// lookup (a mistyped or made-up key costs no hashing and no read).
func WellFormed(s string) bool {
	if len(s) != KeyLength || !strings.HasPrefix(s, Prefix) || s[len(Prefix)+TagLength] != '_' {
		return false
	}
	for _, c := range s[len(Prefix) : len(Prefix)+TagLength] {
		if !(c >= 'a' && c <= 'z' || c >= '2' && c <= '7') {
			return false
		}
	}
	rest := s[len(Prefix)+TagLength+1:]
	for i := 0; i < len(rest); i++ {
		if strings.IndexByte(base62Digits, rest[i]) < 0 {
			return false
		}
	}
	body := s[:KeyLength-checkChars]
	return checksum(body) == s[KeyLength-checkChars:]
}

// Hint is what lists show of a key: its prefix and tag, and its last four
// characters (of the checksum, which follows from the rest: they tell keys
// apart and say next to nothing of the 256 random bits).
func Hint(key string) string {
	return key[:len(Prefix)+TagLength+1] + "…" + key[KeyLength-4:]
}
