package procfs

import (
	"os"
	"strings"
	"testing"
)

func TestParseStat(t *testing.T) {
	// A command name with spaces and a ')' of its own, 52 fields.
	f := make([]string, 50) // fields 3 to 52
	for i := range f {
		f[i] = "0"
	}
	f[0], f[1], f[2], f[3], f[5], f[19], f[47], f[48], f[49] = "S", "7", "42", "40", "-1", "12345", "1000", "1010", "9"
	parse := func() Stat {
		t.Helper()
		st, err := ParseStat([]byte("42 (a) b (c)) " + strings.Join(f, " ") + "\n"))
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	st := parse()
	want := Stat{State: 'S', PPid: 7, PGid: 42, Sid: 40, TPGid: -1, StartTime: 12345, ExitCode: 9, EnvBytes: 10}
	if st != want {
		t.Errorf("got %+v, want %+v", st, want)
	}
	if st.Dead() {
		t.Error("a sleeping process is not dead")
	}

	// Inside an execve: no environment laid out yet. A kernel thread and
	// a zombie have none either, and are not starting a program.
	f[47], f[48] = "0", "0"
	if st := parse(); !st.Execing || st.EnvBytes != 0 {
		t.Errorf("execve in progress: %+v", st)
	}
	f[6] = "2097152" // PF_KTHREAD
	if st := parse(); st.Execing {
		t.Errorf("a kernel thread is not inside an execve: %+v", st)
	}
	f[0], f[6] = "Z", "0"
	if st := parse(); st.Execing {
		t.Errorf("a zombie is not inside an execve: %+v", st)
	}
	for _, bad := range []string{"", "42 (no end", "42 (short) S 1 2"} {
		if _, err := ParseStat([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestReadStatSelf(t *testing.T) {
	st, err := ReadStat("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st.PPid != os.Getppid() || st.StartTime == 0 || st.Dead() || st.Execing || st.EnvBytes == 0 {
		t.Errorf("own stat: %+v (ppid %d)", st, os.Getppid())
	}
}

func TestOOMKills(t *testing.T) {
	dir := t.TempDir()
	for body, want := range map[string]int64{
		"low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n": 2, // v2 memory.events
		"oom_kill_disable 0\nunder_oom 0\noom_kill 5\n":               5, // v1 memory.oom_control
		"oom 1\n": 0,
	} {
		p := dir + "/f"
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if got := OOMKills(p); got != want {
			t.Errorf("%q: %d, want %d", body, got, want)
		}
	}
	if got := OOMKills(dir + "/missing"); got != 0 {
		t.Errorf("a missing file: %d", got)
	}
}
