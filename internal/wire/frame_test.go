package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
)

func TestDecodeClient(t *testing.T) {
	for _, tc := range []struct {
		text  bool
		in    string
		kind  MsgKind
		code  string
		check func(ClientMsg) bool
	}{
		{false, "\x00ls\n", MsgStdin, "", func(m ClientMsg) bool { return string(m.Data) == "ls\n" }},
		{false, "\x00", MsgStdin, "", func(m ClientMsg) bool { return len(m.Data) == 0 }},
		{false, "", 0, CodeUnknownChannel, nil},
		{false, "\x05abc", 0, CodeUnknownChannel, nil},
		{false, "\x01abc", 0, CodeUnknownChannel, nil},
		{true, `{"type":"stdin","data":"héllo"}`, MsgStdin, "", func(m ClientMsg) bool { return string(m.Data) == "héllo" }},
		{true, `{"type":"stdin"}`, 0, CodeInvalidFrame, nil},
		{true, `{"type":"resize","cols":120,"rows":40}`, MsgResize, "", func(m ClientMsg) bool { return m.Cols == 120 && m.Rows == 40 }},
		{true, `{"type":"resize","cols":0,"rows":40}`, 0, CodeInvalidFrame, nil},
		{true, `{"type":"resize","cols":70000,"rows":40}`, 0, CodeInvalidFrame, nil},
		{true, `{"type":"resize","cols":"80","rows":40}`, 0, CodeInvalidFrame, nil},
		{true, `{"type":"resize","rows":40}`, 0, CodeInvalidFrame, nil},
		{true, `{"type":"signal","signal":"SIGINT"}`, MsgSignal, "", func(m ClientMsg) bool { return m.Signal == Signals["SIGINT"] }},
		{true, `{"type":"signal","signal":"TERM"}`, MsgSignal, "", func(m ClientMsg) bool { return m.Signal == Signals["SIGTERM"] }},
		{true, `{"type":"signal","signal":"SIGSTOP"}`, 0, CodeUnknownSignal, nil},
		{true, `{"type":"signal"}`, 0, CodeInvalidFrame, nil},
		{true, `{"type":"ping"}`, MsgPing, "", nil},
		{true, `{"type":"eof"}`, MsgEOF, "", nil},
		{true, `{"type":"launch"}`, 0, CodeUnknownType, nil},
		{true, `{}`, 0, CodeInvalidFrame, nil},
		{true, `null`, 0, CodeInvalidFrame, nil},
		{true, `{"type":`, 0, CodeInvalidFrame, nil},
		{true, `[1,2]`, 0, CodeInvalidFrame, nil},
	} {
		m, err := DecodeClient(tc.text, []byte(tc.in))
		if tc.code != "" {
			var fe *FrameError
			if !errors.As(err, &fe) || fe.Code != tc.code {
				t.Errorf("%q: got %v, want error %s", tc.in, err, tc.code)
			}
			continue
		}
		if err != nil || m.Kind != tc.kind || (tc.check != nil && !tc.check(m)) {
			t.Errorf("%q: got %+v, %v", tc.in, m, err)
		}
	}
}

func TestServerFrames(t *testing.T) {
	f := AppendReplay(nil, 1<<40+5, []byte("abc"))
	if !bytes.Equal(f[:9], []byte{3, 0, 0, 1, 0, 0, 0, 0, 5}) {
		t.Fatalf("replay header % x", f[:9])
	}
	sf, err := DecodeServer(f)
	if err != nil || sf.Channel != ChanReplay || sf.Offset != 1<<40+5 || string(sf.Data) != "abc" {
		t.Fatalf("decode: %+v %v", sf, err)
	}
	var m ServerMsg
	if err := json.Unmarshal(ExitFrame(0), &m); err != nil || m.Type != "exit" || m.ExitCode == nil || *m.ExitCode != 0 {
		t.Fatalf("exit frame %s", ExitFrame(0))
	}
	if got := string(ConnectedFrame("pty-x", ModePipe)); got != `{"type":"connected","session_id":"pty-x","mode":"pipe"}` {
		t.Fatalf("connected frame %s", got)
	}
}

// FuzzDecodeClient: no client frame crashes the decoder; accepted frames
// are well formed; refused ones carry a known code.
func FuzzDecodeClient(f *testing.F) {
	for _, s := range []string{
		"\x00hello", "\x00", "\x03\x00", `{"type":"resize","cols":80,"rows":24}`, `{"type":"signal","signal":"SIGINT"}`,
		`{"type":"stdin","data":"x"}`, `{"type":"ping"}`, `{"type":"eof"}`, `{"type":"resize","cols":-1,"rows":1e99}`,
		`{"type":"\u0000"}`, `{"type":"signal","signal":null}`, "\xff\xfe", `{"type":"stdin","data":"\ud800"}`,
	} {
		f.Add(true, []byte(s))
		f.Add(false, []byte(s))
	}
	codes := map[string]bool{CodeInvalidFrame: true, CodeUnknownType: true, CodeUnknownChannel: true, CodeUnknownSignal: true}
	f.Fuzz(func(t *testing.T, text bool, frame []byte) {
		m, err := DecodeClient(text, frame)
		if err != nil {
			var fe *FrameError
			if !errors.As(err, &fe) || !codes[fe.Code] {
				t.Fatalf("error %v has no known code", err)
			}
			return
		}
		switch m.Kind {
		case MsgStdin, MsgPing, MsgEOF:
		case MsgResize:
			if m.Cols == 0 || m.Rows == 0 {
				t.Fatalf("resize to %dx%d accepted", m.Cols, m.Rows)
			}
		case MsgSignal:
			found := false
			for _, s := range Signals {
				found = found || s == m.Signal
			}
			if !found {
				t.Fatalf("signal %v accepted", m.Signal)
			}
		default:
			t.Fatalf("kind %d", m.Kind)
		}
		if !text && !bytes.Equal(m.Data, frame[1:]) {
			t.Fatal("stdin data is not the frame's payload")
		}
	})
}

// FuzzReplayFrame: encoding then decoding a replay frame is the identity,
// and decoding arbitrary bytes never crashes.
func FuzzReplayFrame(f *testing.F) {
	f.Add(int64(0), []byte("abc"), []byte{3, 0, 0, 0, 0, 0, 0, 0, 1, 'x'})
	f.Add(int64(1<<40), []byte{}, []byte{1, 'a'})
	f.Add(int64(7), []byte("\xe2\x82"), []byte{3, 0xff, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, off int64, data, raw []byte) {
		DecodeServer(raw)
		if off < 0 || off > 1<<62 {
			return
		}
		sf, err := DecodeServer(AppendReplay(nil, off, data))
		if err != nil || sf.Channel != ChanReplay || sf.Offset != off || !bytes.Equal(sf.Data, data) {
			t.Fatalf("round trip of (%d, %q): %+v, %v", off, data, sf, err)
		}
	})
}
