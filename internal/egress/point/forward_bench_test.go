package point_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	vnl "github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/egress/egresstest"
)

// BenchmarkForwardDesign measures issue 23's kernel-forwarding design for
// the egress point before it is built, beside BenchmarkEgress's two paths
// (benchPaths; all ratios are to "direct"):
//
//	fwd   a router namespace forwards the box's connection to a.test over
//	      a second veth into the internet's namespace, masquerading it,
//	      when its (source . destination) pair is in a set, else drops it
//	      at the SYN: what CIDR rules would cost, no user space at all
//	fwdq  the same, with each connection's first payload packet sent to an
//	      NFQUEUE whose reader accepts it only if it names Host a.test (a
//	      conntrack mark then lets the rest pass): what domain rules would
//	      cost
//
// Neither path enforces anything but that (no policy, DNS, counts, logs,
// resets): they are prototypes of the data path only. This kernel has no
// nft_queue (CONFIG_NFT_QUEUE unset), so the queue is the xtables NFQUEUE
// target through nft_compat (iptables-nft). Needs nft, iptables-nft and
// nsenter. Run:
//
//	go test -run '^$' -bench BenchmarkForwardDesign -benchtime 3x ./internal/egress/point/
func BenchmarkForwardDesign(b *testing.B) {
	in := egresstest.Start(b)
	a := egresstest.A.String() + ":80"
	fwd := forwardBox(b, in, 0, false)
	fwdq := forwardBox(b, in, 1, true)

	// Both paths decide for real: an address not in the set is dropped at
	// its SYN, and the queued path drops a first flight naming another host
	// (a built path would reset both).
	ctx, cancel := context.WithTimeout(b.Context(), time.Second)
	defer cancel()
	if c, err := fwd.box.dial(ctx, egresstest.B.String()+":80"); !isTimeout(err) {
		b.Fatalf("b.test's address, never admitted: %v, %v; want the dial to time out", c, err)
	}
	c, err := fwdq.box.dial(b.Context(), a)
	if err != nil {
		b.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(time.Second))
	fmt.Fprintf(c, "GET /who HTTP/1.1\r\nHost: b.test\r\nConnection: close\r\n\r\n")
	if n, err := c.Read(make([]byte, 1)); n != 0 || !isTimeout(err) {
		b.Fatalf("a first flight naming b.test: read %d, %v; want a timeout", n, err)
	}
	c.Close()
	if fwdq.denied.Load() == 0 {
		b.Fatal("the queue's reader saw no denied packet")
	}

	benchPaths(b, []benchPath{
		{"direct", directBox(b, in), "10.99.0.2:80"},
		{"point", pointBox(b, in), a},
		{"fwd", fwd.box, a},
		{"fwdq", fwdq.box, a},
	})
	b.Logf("fwdq: %d packets queued (%d denied)", fwdq.queued.Load(), fwdq.denied.Load())
}

type forwarded struct {
	box            *box
	queued, denied atomic.Int64
}

// forwardBox makes box (10.98.0.2) ↔ router (10.98.0.1 | 10.97.0.4n+1) ↔
// internet (10.97.0.4n+2, link i<n>) and the router's rules; with queue,
// it reads the router's queue until b ends. Both veths have the point's
// MTU (vethMTU): with 1500 on the second, fwd's download fell to 0.71-0.91x
// direct's.
func forwardBox(b *testing.B, in *egresstest.Internet, n int, queue bool) *forwarded {
	f := &forwarded{box: newBox(b)}
	router := newBox(b)
	inNS, err := netns.GetFromPath(in.NetnsPath)
	if err != nil {
		b.Fatal(err)
	}
	defer inNS.Close()
	sh, rh, ih := handleAt(b, f.box.ns), handleAt(b, router.ns), handleAt(b, inNS)
	inLink := fmt.Sprintf("i%d", n)
	for _, v := range []*vnl.Veth{
		{LinkAttrs: vnl.LinkAttrs{Name: "r0", MTU: 65535}, PeerName: "s0", PeerNamespace: vnl.NsFd(int(f.box.ns))},
		{LinkAttrs: vnl.LinkAttrs{Name: "r1", MTU: 65535}, PeerName: inLink, PeerNamespace: vnl.NsFd(int(inNS))},
	} {
		if err := rh.LinkAdd(v); err != nil {
			b.Fatal(err)
		}
	}
	linkUp(b, rh, "r0", "10.98.0.1/30")
	s0 := linkUp(b, sh, "s0", "10.98.0.2/30")
	r1 := linkUp(b, rh, "r1", fmt.Sprintf("10.97.0.%d/30", 4*n+1))
	linkUp(b, ih, inLink, fmt.Sprintf("10.97.0.%d/30", 4*n+2))
	linkUp(b, sh, "lo", "")
	linkUp(b, rh, "lo", "")
	if err := sh.RouteAdd(&vnl.Route{LinkIndex: s0.Attrs().Index, Gw: []byte{10, 98, 0, 1}}); err != nil {
		b.Fatal(err)
	}
	if err := rh.RouteAdd(&vnl.Route{LinkIndex: r1.Attrs().Index, Gw: []byte{10, 97, 0, byte(4*n + 2)}}); err != nil {
		b.Fatal(err)
	}
	nsRun(b, router.path, "", "sysctl", "-qw", "net.ipv4.ip_forward=1")
	// "@ih,0,8 >= 0" matches a packet with a transport payload (the
	// expression breaks on an empty one): the first such packet of a
	// connection is marked 7 for the queue (fw) and, once the queue
	// accepted it, its connection is marked 1 (fw2).
	rules := `table inet proto {
  set admitted { type ipv4_addr . ipv4_addr; flags timeout; elements = { 10.98.0.2 . ` + egresstest.A.String() + ` timeout 1h } }
  chain pre0 { type filter hook prerouting priority -150; policy accept;
    iifname "r0" ct state new ip saddr . ip daddr != @admitted drop
  }
  chain fw { type filter hook forward priority -10; policy accept;
    iifname "r0" ct mark 0 tcp dport 80 @ih,0,8 >= 0x0 meta mark set 7
  }
  chain fw2 { type filter hook forward priority 10; policy accept;
    iifname "r0" ct mark 0 tcp dport 80 @ih,0,8 >= 0x0 ct mark set 1
  }
  chain pnat { type nat hook postrouting priority 100; policy accept;
    oifname "r1" masquerade
  }
}
`
	if !queue {
		rules = strings.Replace(rules, "meta mark set 7", "counter", 1)
	}
	nsRun(b, router.path, rules, "nft", "-f", "-")
	if queue {
		nsRun(b, router.path, "", "iptables-nft", "-A", "FORWARD", "-m", "mark", "--mark", "7", "-j", "NFQUEUE", "--queue-num", "7")
		f.readQueue(b, router.ns, 7)
	}
	return f
}

func nsRun(b *testing.B, nsPath, stdin string, args ...string) {
	cmd := exec.Command("nsenter", append([]string{"--net=" + nsPath, "--"}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("%v: %v\n%s", args, err, out)
	}
}

// nfnetlink_queue's message types and attributes (linux/netfilter/
// nfnetlink_queue.h).
const (
	nfqPacket  = 3<<8 | 0 // NFNL_SUBSYS_QUEUE, NFQNL_MSG_PACKET
	nfqVerdict = 3<<8 | 1
	nfqConfig  = 3<<8 | 2

	nfqaPacketHdr  = 1
	nfqaVerdictHdr = 2
	nfqaPayload    = 10
	nfqaCfgCmd     = 1
	nfqaCfgParams  = 2
)

// readQueue binds queue num in ns and answers each packet until b ends:
// accepted if it holds "Host: a.test", else dropped.
func (f *forwarded) readQueue(b *testing.B, ns netns.NsHandle, num uint16) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(ns)})
	if err != nil {
		b.Fatal(err)
	}
	msg := func(typ netlink.HeaderType, flags netlink.HeaderFlags, attrs func(*netlink.AttributeEncoder)) netlink.Message {
		ae := netlink.NewAttributeEncoder()
		attrs(ae)
		data, _ := ae.Encode()
		// struct nfgenmsg: family, version, queue number (big endian).
		return netlink.Message{Header: netlink.Header{Type: typ, Flags: netlink.Request | flags}, Data: append([]byte{unix.AF_UNSPEC, 0, byte(num >> 8), byte(num)}, data...)}
	}
	config := func(attrs func(*netlink.AttributeEncoder)) {
		if _, err := c.Execute(msg(nfqConfig, netlink.Acknowledge, attrs)); err != nil {
			b.Fatalf("nfqueue config: %v", err)
		}
	}
	config(func(ae *netlink.AttributeEncoder) { ae.Bytes(nfqaCfgCmd, []byte{1, 0, 0, 0}) }) // NFQNL_CFG_CMD_BIND
	config(func(ae *netlink.AttributeEncoder) {
		// struct nfqnl_msg_config_params: copy range, NFQNL_COPY_PACKET.
		ae.Bytes(nfqaCfgParams, []byte{0, 0, 0xff, 0xff, 2})
	})
	done := make(chan struct{})
	b.Cleanup(func() { c.Close(); <-done })
	go func() {
		defer close(done)
		for {
			msgs, err := c.Receive()
			if err != nil {
				return
			}
			for _, m := range msgs {
				if m.Header.Type != nfqPacket || len(m.Data) < 4 {
					continue
				}
				ad, err := netlink.NewAttributeDecoder(m.Data[4:])
				if err != nil {
					continue
				}
				var id []byte
				var payload []byte
				for ad.Next() {
					switch ad.Type() {
					case nfqaPacketHdr:
						id = ad.Bytes()[:4]
					case nfqaPayload:
						payload = ad.Bytes()
					}
				}
				f.queued.Add(1)
				verdict := uint32(1) // NF_ACCEPT
				if !bytes.Contains(payload, []byte("\r\nHost: a.test\r\n")) {
					verdict = 0 // NF_DROP
					f.denied.Add(1)
				}
				vh := binary.BigEndian.AppendUint32(nil, verdict)
				vh = append(vh, id...)
				_, _ = c.Send(msg(nfqVerdict, 0, func(ae *netlink.AttributeEncoder) { ae.Bytes(nfqaVerdictHdr, vh) }))
			}
		}
	}()
}
