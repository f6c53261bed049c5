package handlers

import (
	"strconv"
	"testing"
)

// The since parameter: what parseSince accepts is a non-negative offset
// written in plain decimal digits, and it reads back the same number.
func FuzzParseSince(f *testing.F) {
	for _, s := range []string{"0", "1048576", "-1", "+5", " 5", "5 ", "1e3", "0x10", "9223372036854775807", "9223372036854775808", "", "007"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		n, err := parseSince(v)
		if err != nil {
			return
		}
		if n < 0 {
			t.Fatalf("%q accepted as %d", v, n)
		}
		for _, c := range v {
			if c < '0' || c > '9' {
				t.Fatalf("%q accepted: not plain digits", v)
			}
		}
		if m, err := strconv.ParseInt(v, 10, 64); err != nil || m != n {
			t.Fatalf("%q read as %d", v, n)
		}
	})
}
