package directory

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"runtime"
	"strings"

	"golang.org/x/crypto/argon2"
)

// Password hashing: argon2id with RFC 9106's second recommended option
// (t=3, m=64 MiB, p=4), a 16-byte salt from crypto/rand and a 32-byte key,
// stored in the PHC string format so the parameters travel with the hash.
const (
	argonTime    = 3
	argonMemory  = 64 * 1024
	argonThreads = 4
	argonKeyLen  = 32
	argonSaltLen = 16
)

// MinPasswordLength is the spec's minimum.
const MinPasswordLength = 8

// maxPasswordLength bounds the work one request can ask of argon2.
const maxPasswordLength = 1024

// hashing bounds the argon2id computations running at once: each holds 64
// MiB, and a burst of password writes must not take the server's memory.
// More than the processors would not finish sooner anyway.
var hashing = make(chan struct{}, runtime.GOMAXPROCS(0))

// HashingMemory is the most memory the password hashes running at once hold.
// A soft memory limit must leave room for it: below it, the runtime returns
// each hash's 64 MiB to the system as it ends and faults it back in for the
// next, which cost sign-ins more than half their rate.
func HashingMemory() int64 { return int64(cap(hashing)) * argonMemory << 10 }

func argon2Key(password, salt []byte, time, memory uint32, threads uint8, keyLen uint32) []byte {
	hashing <- struct{}{}
	defer func() { <-hashing }()
	return argon2.IDKey(password, salt, time, memory, threads, keyLen)
}

// HashPassword returns the PHC string of a new argon2id hash of password.
func HashPassword(password string) (string, error) {
	salt := make([]byte, argonSaltLen)
	if _, err := rand.Read(salt); err != nil {
		return "", err
	}
	key := argon2Key([]byte(password), salt, argonTime, argonMemory, argonThreads, argonKeyLen)
	enc := base64.RawStdEncoding
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s", argon2.Version, argonMemory, argonTime, argonThreads,
		enc.EncodeToString(salt), enc.EncodeToString(key)), nil
}

// VerifyPassword tells whether password matches a PHC argon2id hash, in
// constant time.
func VerifyPassword(encoded, password string) (bool, error) {
	parts := strings.Split(encoded, "$")
	if len(parts) != 6 || parts[1] != "argon2id" {
		return false, errors.New("not an argon2id hash")
	}
	var version int
	var memory, time uint32
	var threads uint8
	if _, err := fmt.Sscanf(parts[2], "v=%d", &version); err != nil || version != argon2.Version {
		return false, errors.New("unsupported argon2 version")
	}
	if _, err := fmt.Sscanf(parts[3], "m=%d,t=%d,p=%d", &memory, &time, &threads); err != nil {
		return false, errors.New("malformed argon2 parameters")
	}
	salt, err1 := base64.RawStdEncoding.DecodeString(parts[4])
	key, err2 := base64.RawStdEncoding.DecodeString(parts[5])
	if err1 != nil || err2 != nil || len(key) == 0 {
		return false, errors.New("malformed argon2 hash")
	}
	if memory > 1<<20 || time > 10 || threads == 0 || len(key) > 64 { // a stored hash is ours; refuse absurd work
		return false, errors.New("argon2 parameters out of range")
	}
	got := argon2Key([]byte(password), salt, time, memory, threads, uint32(len(key)))
	return subtle.ConstantTimeCompare(got, key) == 1, nil
}
