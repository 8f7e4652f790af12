package persistence

// MapError is mapError, for the tests of the persistence_test package.
var MapError = mapError
