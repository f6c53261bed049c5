package main

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Series is one side of a comparison: its samples (milliseconds, or MB/s
// for throughput) and their summary.
type Series struct {
	Label  string    `json:"label"`
	Values []float64 `json:"values"`
	P50    float64   `json:"p50"`
	P99    float64   `json:"p99"`
}

func series(label string, v []float64) Series {
	s := Series{Label: label, Values: v}
	if len(v) > 0 {
		sorted := slices.Sorted(slices.Values(v))
		s.P50 = sorted[int(math.Round(float64(len(sorted)-1)*0.5))]
		s.P99 = sorted[int(math.Round(float64(len(sorted)-1)*0.99))]
	}
	return s
}

func millis(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d) / float64(time.Millisecond)
	}
	return out
}

// Result is one scenario on one provider: the gateway's series and, where
// there is one, the baseline's, run alternately in the same rounds.
type Result struct {
	Scenario string             `json:"scenario"`
	Provider string             `json:"provider"`
	Unit     string             `json:"unit"` // "ms" (lower is better) or "MB/s" (higher is better)
	Gateway  Series             `json:"gateway"`
	Baseline *Series            `json:"baseline,omitempty"`
	Ratio    float64            `json:"ratio,omitempty"` // gateway p50 / baseline p50
	Target   string             `json:"target,omitempty"`
	Met      *bool              `json:"target_met,omitempty"`
	MissedBy float64            `json:"missed_by,omitempty"` // how far a missed bound is from the figure, as a fraction of the bound (see atMost)
	Extra    map[string]float64 `json:"extra,omitempty"`
	Note     string             `json:"note,omitempty"`
}

// compare makes a Result of gateway and baseline samples.
func compare(scenario, provider, unit string, gw Series, base *Series) Result {
	r := Result{Scenario: scenario, Provider: provider, Unit: unit, Gateway: gw, Baseline: base}
	if base != nil && base.P50 > 0 {
		r.Ratio = gw.P50 / base.P50
	}
	return r
}

// judge records whether the target holds.
func (r *Result) judge(target string, ok bool) {
	r.Target, r.Met = target, &ok
}

// atMost judges the target v ≤ bound and, when it is missed, records by
// how much (see MissedBy).
func (r *Result) atMost(target string, v, bound float64) {
	r.judge(target, v <= bound)
	if v > bound && bound > 0 {
		r.MissedBy = v/bound - 1
	}
}

// atLeast judges the target v ≥ bound as atMost does.
func (r *Result) atLeast(target string, v, bound float64) {
	r.judge(target, v >= bound)
	if v < bound && bound > 0 {
		r.MissedBy = 1 - v/bound
	}
}

// Report is a run of the harness.
type Report struct {
	Started time.Time `json:"started"`
	Machine string    `json:"machine"`
	Rounds  int       `json:"rounds"`
	Results []Result  `json:"results"`
}

func (rep *Report) table(w io.Writer) {
	fmt.Fprintf(w, "\nsandgate benchmarks, %s, on %s (%d rounds, gateway and baseline alternating)\n\n",
		rep.Started.Format(time.RFC3339), rep.Machine, rep.Rounds)
	fmt.Fprintln(w, "| scenario | provider | gateway p50 | gateway p99 | baseline | baseline p50 | gateway ÷ baseline | target |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	for _, r := range rep.Results {
		base, bp50, ratio := "—", "—", "—"
		if r.Baseline != nil {
			base, bp50 = r.Baseline.Label, num(r.Baseline.P50, r.Unit)
			ratio = fmt.Sprintf("%.2f", r.Ratio)
			if r.Ratio < 0.1 {
				// A small ratio of times is a win; of throughputs, a loss.
				how := "faster"
				if r.Unit == "MB/s" {
					how = "slower"
				}
				ratio = fmt.Sprintf("%.2g (%.0fx %s)", r.Ratio, 1/r.Ratio, how)
			}
		}
		target := r.Target
		if r.Met != nil {
			if *r.Met {
				target += ": met"
			} else {
				target += ": **missed**"
				if r.MissedBy > 0 {
					target += fmt.Sprintf(" by %.0f%%", 100*r.MissedBy)
				}
			}
		}
		if len(r.Extra) > 0 {
			var ks []string
			for _, k := range slices.Sorted(maps.Keys(r.Extra)) {
				ks = append(ks, fmt.Sprintf("%s %.4g", k, r.Extra[k]))
			}
			target = strings.TrimPrefix(target+"; "+strings.Join(ks, ", "), "; ")
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", r.Scenario, r.Provider,
			num(r.Gateway.P50, r.Unit), num(r.Gateway.P99, r.Unit), base, bp50, ratio, target)
	}
}

func num(v float64, unit string) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f %s", v, unit)
	case v >= 10:
		return fmt.Sprintf("%.1f %s", v, unit)
	}
	return fmt.Sprintf("%.2f %s", v, unit)
}

// write saves the report as results.json and results.svg under dir.
func (rep *Report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := writeJSONFile(filepath.Join(dir, "results.json"), rep); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "results.svg"), []byte(rep.svg()), 0o644)
}

// mergeInto puts the results of an earlier report (at path) that this
// one did not measure again before its own, in their order.
func (rep *Report) mergeInto(path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	var old Report
	if json.Unmarshal(b, &old) != nil {
		return
	}
	key := func(r Result) string { return r.Provider + "\x00" + r.Scenario }
	fresh := map[string]Result{}
	for _, r := range rep.Results {
		fresh[key(r)] = r
	}
	var out []Result
	for _, r := range old.Results {
		if f, ok := fresh[key(r)]; ok {
			r = f
			delete(fresh, key(r))
		}
		out = append(out, r)
	}
	for _, r := range rep.Results {
		if _, ok := fresh[key(r)]; ok {
			out = append(out, r)
		}
	}
	rep.Results = out
}

func writeJSONFile(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// svg draws each result as a row of two distributions on a log scale:
// every sample as a tick, the p50 as a bar, gateway above baseline.
func (rep *Report) svg() string {
	const left, width, rowH = 330, 560, 44
	var b strings.Builder
	h := 60 + rowH*len(rep.Results)
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", left+width+120, h)
	fmt.Fprintf(&b, `<text x="10" y="20" font-size="14">sandgate: gateway (blue) vs baseline (grey), %s</text>`+"\n", html.EscapeString(rep.Machine))
	fmt.Fprintf(&b, `<text x="10" y="38" fill="#555">samples as ticks, p50 as a bar; log scale per row</text>`+"\n")
	for i, r := range rep.Results {
		y := 50 + i*rowH
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, s := range []*Series{&r.Gateway, r.Baseline} {
			if s == nil {
				continue
			}
			for _, v := range s.Values {
				if v > 0 {
					lo, hi = math.Min(lo, v), math.Max(hi, v)
				}
			}
		}
		if math.IsInf(lo, 0) {
			continue
		}
		lo, hi = lo/1.2, hi*1.2
		x := func(v float64) float64 { return left + width*math.Log(v/lo)/math.Log(hi/lo) }
		fmt.Fprintf(&b, `<text x="10" y="%d">%s (%s)</text>`+"\n", y+18, html.EscapeString(r.Scenario), r.Provider)
		fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#555">%s … %s</text>`+"\n", left+width+8, y+18, num(lo, r.Unit), num(hi, r.Unit))
		for j, s := range []*Series{&r.Gateway, r.Baseline} {
			if s == nil {
				continue
			}
			color, yy := "#1f77b4", y+6
			if j == 1 {
				color, yy = "#999", y+22
			}
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="12" fill="%s" opacity="0.25"/>`+"\n", left, yy, math.Max(x(s.P50)-left, 1), color)
			for _, v := range s.Values {
				if v > 0 {
					fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="%s"/>`+"\n", x(v), x(v), yy, yy+12, color)
				}
			}
		}
	}
	b.WriteString("</svg>\n")
	return b.String()
}
