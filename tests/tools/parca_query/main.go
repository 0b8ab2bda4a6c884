// parca_query asks a Parca server through its gRPC query API (Parca's own
// generated client) and prints what the fleet tests compare, as JSON:
//
//	parca_query -addr 127.0.0.1:7070 top    QUERY START_MS END_MS   -> {"total":N,"flat":{"function":n,...},"cum":{...}}
//	parca_query -addr 127.0.0.1:7070 range  QUERY START_MS END_MS   -> [{"time_ms":t,"duration_ms":d,"value":v},...]
//	parca_query -addr 127.0.0.1:7070 labels START_MS END_MS         -> ["name",...]
//	parca_query -addr 127.0.0.1:7070 types                           -> ["name:sample:unit:period:unit[:delta]",...] (all it holds)
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"time"

	querypb "github.com/parca-dev/parca/gen/proto/go/parca/query/v1alpha1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func millis(text string) *timestamppb.Timestamp {
	ms, err := strconv.ParseInt(text, 10, 64)
	if err != nil {
		fail("a time in Unix milliseconds: %q", text)
	}
	return timestamppb.New(time.UnixMilli(ms))
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "parca_query: "+format+"\n", args...)
	os.Exit(2)
}

func main() {
	addr := flag.String("addr", "127.0.0.1:7070", "Parca's address")
	flag.Parse()
	args := flag.Args()
	if len(args) < 1 {
		fail("usage: parca_query -addr ADDR top|range|labels|types ...")
	}
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fail("connecting: %v", err)
	}
	defer conn.Close()
	client := querypb.NewQueryServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out any
	switch {
	case args[0] == "top" && len(args) == 4:
		response, err := client.Query(ctx, &querypb.QueryRequest{
			Mode: querypb.QueryRequest_MODE_MERGE,
			Options: &querypb.QueryRequest_Merge{Merge: &querypb.MergeProfile{
				Query: args[1], Start: millis(args[2]), End: millis(args[3]),
			}},
			ReportType: querypb.QueryRequest_REPORT_TYPE_TOP,
		})
		if err != nil {
			fail("top: %v", err)
		}
		flat := map[string]int64{}
		cum := map[string]int64{}
		for _, node := range response.GetTop().GetList() {
			name := node.GetMeta().GetFunction().GetName()
			if name == "" {
				name = "?"
			}
			flat[name] += node.GetFlat()
			cum[name] += node.GetCumulative()
		}
		out = map[string]any{"total": response.GetTotal(), "flat": flat, "cum": cum}
	case args[0] == "range" && len(args) == 4:
		response, err := client.QueryRange(ctx, &querypb.QueryRangeRequest{
			Query: args[1], Start: millis(args[2]), End: millis(args[3]),
			// One millisecond: each profile its own point at its own time.
			Step: durationpb.New(time.Millisecond),
		})
		if err != nil {
			fail("range: %v", err)
		}
		type point struct {
			TimeMs     int64 `json:"time_ms"`
			DurationMs int64 `json:"duration_ms"`
			Value      int64 `json:"value"`
		}
		byTime := map[int64]*point{}
		for _, series := range response.GetSeries() {
			for _, sample := range series.GetSamples() {
				ms := sample.GetTimestamp().AsTime().UnixMilli()
				p, ok := byTime[ms]
				if !ok {
					p = &point{TimeMs: ms}
					byTime[ms] = p
				}
				if d := sample.GetDuration() / 1_000_000; d > p.DurationMs {
					p.DurationMs = d
				}
				p.Value += sample.GetValue()
			}
		}
		points := make([]point, 0, len(byTime))
		for _, p := range byTime {
			points = append(points, *p)
		}
		sort.Slice(points, func(i, j int) bool { return points[i].TimeMs < points[j].TimeMs })
		out = points
	case args[0] == "labels" && len(args) == 3:
		response, err := client.Labels(ctx, &querypb.LabelsRequest{Start: millis(args[1]), End: millis(args[2])})
		if err != nil {
			fail("labels: %v", err)
		}
		out = response.GetLabelNames()
	case args[0] == "types" && len(args) == 1:
		response, err := client.ProfileTypes(ctx, &querypb.ProfileTypesRequest{})
		if err != nil {
			fail("types: %v", err)
		}
		// As Parca's queries name them: name:sample:unit:period:unit[:delta].
		types := []string{}
		for _, t := range response.GetTypes() {
			name := fmt.Sprintf("%s:%s:%s:%s:%s", t.GetName(), t.GetSampleType(), t.GetSampleUnit(), t.GetPeriodType(), t.GetPeriodUnit())
			if t.GetDelta() {
				name += ":delta"
			}
			types = append(types, name)
		}
		sort.Strings(types)
		out = types
	default:
		fail("usage: parca_query -addr ADDR top|range QUERY START_MS END_MS | labels START_MS END_MS | types")
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail("writing: %v", err)
	}
}
