//go:build !race

package flawpatch

const raceEnabled = false
