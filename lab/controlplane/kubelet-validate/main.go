// Command kubelet-validate checks a KubeletConfiguration (kubelet.config.k8s.io/v1beta1)
// the way the kubelet of the Kubernetes version it is built against does:
//
//   - the file is decoded with the kubelet's own scheme and codec
//     (pkg/kubelet/kubeletconfig/configfiles), so v1beta1 defaults are applied
//     and unknown/duplicate fields are rejected (strict decoding);
//   - kubelet command-line flags given to this tool are re-parsed over the
//     loaded file, with the kubelet's own flag definitions
//     (cmd/kubelet/app/options.AddKubeletConfigFlags), i.e. flags win over
//     the file as in the kubelet;
//   - feature gates are set from the resulting config and
//     pkg/kubelet/apis/config/validation.ValidateKubeletConfiguration runs.
//
// In addition it reports "startup" errors for a few resource-manager settings
// that ValidateKubeletConfiguration does NOT check but that make the kubelet
// fail when its container manager starts (cpumanager/memorymanager NewManager).
// Those checks are re-implemented here (the real code needs cAdvisor machine
// info) and are reported separately.
//
// Usage:
//
//	kubelet-validate [kubelet flags...] [--config] FILE
//
// Output: a JSON document on stdout (always); errors also on stderr.
// Exit status: 0 valid, 1 invalid (validation or startup errors; with --strict
// also unknown/duplicate fields), 2 usage or decode errors (file unreadable,
// not a KubeletConfiguration).
//
// --target-cgroup=v2 (default) validates for a cgroup v2 node regardless of
// the machine this runs on; --target-cgroup=host uses this machine's mode.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"

	libcontainercgroups "github.com/opencontainers/cgroups"
	"github.com/spf13/pflag"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/version"
	"k8s.io/utils/cpuset"

	"k8s.io/kubernetes/cmd/kubelet/app/options"
	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/apis/config"
	kubeletscheme "k8s.io/kubernetes/pkg/kubelet/apis/config/scheme"
	"k8s.io/kubernetes/pkg/kubelet/apis/config/validation"
	"k8s.io/kubernetes/pkg/kubelet/eviction"
	"k8s.io/kubernetes/pkg/kubelet/kubeletconfig/configfiles"
	utilfs "k8s.io/kubernetes/pkg/util/filesystem"
)

type effective struct {
	CPUManagerPolicy             string            `json:"cpuManagerPolicy"`
	CPUManagerPolicyOptions      map[string]string `json:"cpuManagerPolicyOptions,omitempty"`
	CPUManagerReconcilePeriod    string            `json:"cpuManagerReconcilePeriod"`
	TopologyManagerPolicy        string            `json:"topologyManagerPolicy"`
	TopologyManagerScope         string            `json:"topologyManagerScope"`
	TopologyManagerPolicyOptions map[string]string `json:"topologyManagerPolicyOptions,omitempty"`
	MemoryManagerPolicy          string            `json:"memoryManagerPolicy"`
	ReservedMemory               []reservedMemory  `json:"reservedMemory,omitempty"`
	ReservedSystemCPUs           string            `json:"reservedSystemCPUs,omitempty"`
	KubeReserved                 map[string]string `json:"kubeReserved,omitempty"`
	SystemReserved               map[string]string `json:"systemReserved,omitempty"`
	// CPU the kubelet subtracts from allocatable: kubeReserved.cpu +
	// systemReserved.cpu, or the size of reservedSystemCPUs when that is set
	// (the kubelet then overrides both, see cmd/kubelet/app/server.go).
	ReservedCPU            string          `json:"effectiveReservedCPU"`
	EnforceNodeAllocatable []string        `json:"enforceNodeAllocatable,omitempty"`
	CgroupDriver           string          `json:"cgroupDriver"`
	FeatureGates           map[string]bool `json:"featureGates,omitempty"`
}

type reservedMemory struct {
	NumaNode int32             `json:"numaNode"`
	Limits   map[string]string `json:"limits"`
}

type result struct {
	Valid            bool       `json:"valid"`
	KubeletVersion   string     `json:"kubeletVersion"`
	ConfigFile       string     `json:"configFile,omitempty"`
	HostCgroupV2     bool       `json:"hostCgroupV2"`
	TargetCgroup     string     `json:"targetCgroup"`
	DecodeWarnings   []string   `json:"decodeWarnings,omitempty"`
	ValidationErrors []string   `json:"validationErrors,omitempty"`
	StartupErrors    []string   `json:"startupErrors,omitempty"`
	Effective        *effective `json:"effective,omitempty"`
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// newFlagSet registers every kubelet flag (so that a kubelet command line can
// be passed unchanged); the KubeletConfiguration flags are bound to kc.
func newFlagSet(kf *options.KubeletFlags, kc *kubeletconfig.KubeletConfiguration) *pflag.FlagSet {
	fs := pflag.NewFlagSet("kubelet-validate", pflag.ContinueOnError)
	fs.SetNormalizeFunc(cliflag.WordSepNormalizeFunc)
	fs.SetOutput(io.Discard)
	kf.AddFlags(fs)
	options.AddKubeletConfigFlags(fs, kc)
	fs.BoolP("help", "h", false, "show help")
	fs.Bool("strict", false, "treat unknown/duplicate fields in FILE as errors (the kubelet only warns for v1beta1 and ignores them)")
	fs.String("target-cgroup", "v2", "cgroup version of the node the config is for: v2, or host (use this machine's, "+
		"which is what ValidateKubeletConfiguration looks at)")
	return fs
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "usage: kubelet-validate [kubelet flags, e.g. --cpu-manager-policy=static --reserved-cpus=0-1] [--config] FILE\n"+
		"Decodes FILE as the kubelet does, applies kubelet flags over it, runs the kubelet's\n"+
		"ValidateKubeletConfiguration and prints a JSON summary. Exit 0 valid, 1 invalid, 2 usage/decode error.\n")
}

func run(args []string, stdout, stderr io.Writer) int {
	// Phase 1: find --config / the positional file; also catches unknown flags.
	kf := options.NewKubeletFlags()
	kc, err := options.NewKubeletConfiguration()
	if err != nil {
		fmt.Fprintf(stderr, "kubelet-validate: %v\n", err)
		return 2
	}
	fs := newFlagSet(kf, kc)
	if err := fs.Parse(args); err != nil {
		fmt.Fprintf(stderr, "kubelet-validate: %v\n", err)
		usage(stderr)
		return 2
	}
	if help, _ := fs.GetBool("help"); help {
		usage(stdout)
		return 0
	}
	file := kf.KubeletConfigFile
	switch rest := fs.Args(); {
	case len(rest) == 1 && file == "":
		file = rest[0]
	case len(rest) > 0:
		fmt.Fprintf(stderr, "kubelet-validate: unexpected arguments %q\n", rest)
		usage(stderr)
		return 2
	}
	if kf.KubeletDropinConfigDirectory != "" {
		fmt.Fprintf(stderr, "kubelet-validate: --config-dir (drop-in configs) is not supported\n")
		return 2
	}

	target, _ := fs.GetString("target-cgroup")
	hostV2 := libcontainercgroups.IsCgroup2UnifiedMode()
	switch target {
	case "v2", "host":
	default:
		fmt.Fprintf(stderr, "kubelet-validate: --target-cgroup must be v2 or host\n")
		return 2
	}
	res := result{KubeletVersion: version.Get().GitVersion, HostCgroupV2: hostV2, TargetCgroup: target}
	if file != "" {
		// Phase 2, as the kubelet: load the file, then re-parse all flags over it.
		abs, err := filepath.Abs(file)
		if err == nil {
			res.ConfigFile = abs
			kc, err = loadConfigFile(abs)
		}
		if err == nil {
			res.DecodeWarnings = strictDecodeErrors(abs)
		}
		if err != nil {
			fmt.Fprintf(stderr, "kubelet-validate: %v\n", err)
			return 2
		}
		original := kc.FeatureGates
		fs2 := newFlagSet(options.NewKubeletFlags(), kc)
		if err := fs2.Parse(args); err != nil {
			fmt.Fprintf(stderr, "kubelet-validate: %v\n", err)
			return 2
		}
		// Feature gates from the file that flags did not mention are kept.
		for k, v := range original {
			if _, ok := kc.FeatureGates[k]; !ok {
				if kc.FeatureGates == nil {
					kc.FeatureGates = map[string]bool{}
				}
				kc.FeatureGates[k] = v
			}
		}
	}

	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(kc.FeatureGates); err != nil {
		res.ValidationErrors = append(res.ValidationErrors, "featureGates: "+err.Error())
	} else if err := validation.ValidateKubeletConfiguration(forTarget(kc, target, hostV2), utilfeature.DefaultFeatureGate); err != nil {
		var agg utilerrors.Aggregate
		if errors.As(err, &agg) {
			for _, e := range agg.Errors() {
				res.ValidationErrors = append(res.ValidationErrors, e.Error())
			}
		} else {
			res.ValidationErrors = append(res.ValidationErrors, err.Error())
		}
	}

	eff, startupErrs := summarize(kc, kf)
	res.Effective = eff
	res.StartupErrors = startupErrs
	res.Valid = len(res.ValidationErrors) == 0 && len(res.StartupErrors) == 0
	if strict, _ := fs.GetBool("strict"); strict && len(res.DecodeWarnings) > 0 {
		res.Valid = false
	}

	for _, e := range res.ValidationErrors {
		fmt.Fprintf(stderr, "validation: %s\n", e)
	}
	for _, e := range res.DecodeWarnings {
		fmt.Fprintf(stderr, "decode: %s\n", e)
	}
	for _, e := range res.StartupErrors {
		fmt.Fprintf(stderr, "startup: %s\n", e)
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(res)
	if !res.Valid {
		return 1
	}
	return 0
}

// forTarget: the only host-dependent part of ValidateKubeletConfiguration
// (validation_linux.go) checks failCgroupV1 and singleProcessOOMKill=false
// against THIS machine's cgroup mode. Both checks are skipped on a cgroup v2
// host; to validate for a v2 node from a v1 machine the two fields are
// neutralised on a copy, which makes the real function behave as on v2.
func forTarget(kc *kubeletconfig.KubeletConfiguration, target string, hostV2 bool) *kubeletconfig.KubeletConfiguration {
	if target == "host" || hostV2 {
		return kc
	}
	c := kc.DeepCopy()
	c.FailCgroupV1 = false
	c.SingleProcessOOMKill = nil
	return c
}

// strictDecodeErrors reports what strict decoding rejects (unknown or
// duplicate fields). The kubelet's codec falls back to lenient decoding for
// v1beta1 and only logs these, so they do not make the config invalid unless
// --strict is given.
func strictDecodeErrors(abs string) []string {
	data, err := os.ReadFile(abs)
	if err != nil {
		return []string{err.Error()}
	}
	_, codecs, err := kubeletscheme.NewSchemeAndCodecs(serializer.EnableStrict)
	if err != nil {
		return []string{err.Error()}
	}
	if _, _, err := codecs.UniversalDecoder().Decode(data, nil, nil); err != nil && runtime.IsStrictDecodingError(err) {
		return []string{err.Error()}
	}
	return nil
}

// loadConfigFile mirrors cmd/kubelet/app.loadConfigFile: decode with the
// kubelet codecs (defaults, strict), resolve relative paths, default evictionHard.
func loadConfigFile(abs string) (*kubeletconfig.KubeletConfiguration, error) {
	loader, err := configfiles.NewFsLoader(&utilfs.DefaultFs{}, abs)
	if err != nil {
		return nil, err
	}
	kc, err := loader.Load(context.Background())
	if err != nil {
		return nil, err
	}
	if kc.EvictionHard == nil {
		kc.EvictionHard = eviction.DefaultEvictionHard
	} else if kc.MergeDefaultEvictionSettings {
		for k, v := range eviction.DefaultEvictionHard {
			if _, ok := kc.EvictionHard[k]; !ok {
				kc.EvictionHard[k] = v
			}
		}
	}
	return kc, nil
}

// summarize returns the effective resource-manager settings and the errors the
// kubelet would raise when starting its CPU/memory managers (re-implemented;
// see cmd/kubelet/app/server.go and pkg/kubelet/cm/{cpumanager,memorymanager}).
func summarize(kc *kubeletconfig.KubeletConfiguration, kf *options.KubeletFlags) (*effective, []string) {
	var errs []string
	e := &effective{
		CPUManagerPolicy:             kc.CPUManagerPolicy,
		CPUManagerPolicyOptions:      kc.CPUManagerPolicyOptions,
		CPUManagerReconcilePeriod:    kc.CPUManagerReconcilePeriod.Duration.String(),
		TopologyManagerPolicy:        kc.TopologyManagerPolicy,
		TopologyManagerScope:         kc.TopologyManagerScope,
		TopologyManagerPolicyOptions: kc.TopologyManagerPolicyOptions,
		MemoryManagerPolicy:          kc.MemoryManagerPolicy,
		ReservedSystemCPUs:           kc.ReservedSystemCPUs,
		KubeReserved:                 kc.KubeReserved,
		SystemReserved:               kc.SystemReserved,
		EnforceNodeAllocatable:       kc.EnforceNodeAllocatable,
		CgroupDriver:                 kc.CgroupDriver,
		FeatureGates:                 kc.FeatureGates,
	}
	for _, rm := range kc.ReservedMemory {
		l := map[string]string{}
		for k, v := range rm.Limits {
			l[string(k)] = v.String()
		}
		e.ReservedMemory = append(e.ReservedMemory, reservedMemory{NumaNode: rm.NumaNode, Limits: l})
	}
	sort.Slice(e.ReservedMemory, func(i, j int) bool { return e.ReservedMemory[i].NumaNode < e.ReservedMemory[j].NumaNode })

	// Effective CPU reservation (server.go: --reserved-cpus overrides the cpu
	// entries of kubeReserved/systemReserved).
	reserved := resource.MustParse("0")
	parseCPU := func(field string, m map[string]string) {
		if v, ok := m["cpu"]; ok {
			q, err := resource.ParseQuantity(v)
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s.cpu %q does not parse: %v", field, v, err))
				return
			}
			reserved.Add(q)
		}
	}
	if kc.ReservedSystemCPUs != "" {
		if set, err := cpuset.Parse(kc.ReservedSystemCPUs); err == nil {
			reserved = resource.MustParse(strconv.Itoa(set.Size()))
		}
	} else {
		parseCPU("kubeReserved", kc.KubeReserved)
		parseCPU("systemReserved", kc.SystemReserved)
	}
	e.ReservedCPU = reserved.String()

	switch kc.CPUManagerPolicy {
	case "none":
	case "static":
		if reserved.IsZero() {
			errs = append(errs, "cpuManagerPolicy static requires a non-zero CPU reservation "+
				"(kubeReserved.cpu + systemReserved.cpu, or reservedSystemCPUs): the kubelet fails with "+
				"\"[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero\"")
		}
	default:
		errs = append(errs, fmt.Sprintf("cpuManagerPolicy %q is unknown (cpumanager accepts \"none\" or \"static\")", kc.CPUManagerPolicy))
	}
	switch kc.MemoryManagerPolicy {
	case "None":
	case "Static":
		// memorymanager.validateReservedMemory: for type "memory" the sum of
		// reservedMemory limits must equal kubeReserved + systemReserved + the
		// hard eviction threshold (the latter only checkable when absolute).
		want := resource.MustParse("0")
		checkable := true
		for _, m := range []map[string]string{kc.KubeReserved, kc.SystemReserved} {
			if v, ok := m["memory"]; ok {
				if q, err := resource.ParseQuantity(v); err == nil {
					want.Add(q)
				}
			}
		}
		if v, ok := kc.EvictionHard["memory.available"]; ok && !kf.ExperimentalNodeAllocatableIgnoreEvictionThreshold {
			if q, err := resource.ParseQuantity(v); err == nil {
				want.Add(q)
			} else {
				checkable = false // a percentage of node capacity
			}
		}
		have := resource.MustParse("0")
		for _, rm := range kc.ReservedMemory {
			if q, ok := rm.Limits["memory"]; ok {
				have.Add(q)
			}
		}
		if checkable && !have.Equal(want) {
			errs = append(errs, fmt.Sprintf("memoryManagerPolicy Static: reservedMemory total %q of type \"memory\" is not equal to "+
				"kubeReserved+systemReserved+evictionHard[memory.available] = %q (the kubelet refuses to start)", have.String(), want.String()))
		}
	case "BestEffort":
		errs = append(errs, "memoryManagerPolicy \"BestEffort\" is only available on Windows")
	default:
		errs = append(errs, fmt.Sprintf("memoryManagerPolicy %q is unknown (memorymanager accepts \"None\" or \"Static\" on Linux)", kc.MemoryManagerPolicy))
	}
	if len(kc.TopologyManagerPolicyOptions) > 0 && !utilfeature.DefaultFeatureGate.Enabled("TopologyManagerPolicyOptions") {
		errs = append(errs, "topologyManagerPolicyOptions require the TopologyManagerPolicyOptions feature gate")
	}
	return e, errs
}
