package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Labels and annotations the controller puts on the objects it makes.
const (
	// LabelPool marks a pod made by a Pool's warm-up; its value is the pool name.
	LabelPool = Group + "/pool"
	// LabelBatch marks a pod created cold for a BatchSandbox; its value is
	// the batch name. Warm pods taken from a pool are not relabelled (that
	// would cost one write per pod): the batch status is the record.
	LabelBatch = Group + "/batch"
	// LabelTemplateHash is the hash of the SandboxTemplate a pod was made
	// from, so a pool can tell stale pods after a template change.
	LabelTemplateHash = Group + "/template-hash"
	// FinalizerRelease keeps a BatchSandbox until the controller has
	// released (deleted) its pods; without it a pod could be handed out
	// again after a controller restart.
	FinalizerRelease = Group + "/release"
)

// SandboxTemplate describes the pod of one sandbox. The controller turns it
// into a pod whose init container copies the moat binary from AgentImage
// into an emptyDir, and whose main container runs Image with `moat execd`
// as its entrypoint (execd then starts Entrypoint as its child).
type SandboxTemplate struct {
	// Image is the sandbox image.
	// +kubebuilder:validation:MinLength=1
	Image string `json:"image"`
	// Entrypoint is the user command execd starts. Empty: execd alone (the
	// image's own entrypoint is not known to the controller).
	// +optional
	Entrypoint []string `json:"entrypoint,omitempty"`
	// Env is set for the entrypoint and every command the agent runs.
	// +optional
	Env map[string]string `json:"env,omitempty"`
	// WorkingDir of the sandbox container.
	// +optional
	WorkingDir string `json:"workingDir,omitempty"`
	// Resources of the sandbox container.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
	// Labels and Annotations are added to the pod's metadata.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
	// RuntimeClassName selects the node's container runtime (e.g. gVisor).
	// +optional
	RuntimeClassName string `json:"runtimeClassName,omitempty"`
	// NodeSelector and Tolerations place the pod.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// AgentImage is an image holding the static moat binary at /moat; the
	// init container runs `/moat controller copy-agent` from it. Empty:
	// the controller's --agent-image.
	// +optional
	AgentImage string `json:"agentImage,omitempty"`
	// AgentTokenSecret names a Secret in the same namespace whose "token"
	// key is the agent's access token (EXECD_ACCESS_TOKEN). Empty: no auth.
	// +optional
	AgentTokenSecret string `json:"agentTokenSecret,omitempty"`
}

// PoolSpec sizes a pool of warm sandbox pods.
//
// +kubebuilder:validation:XValidation:rule="!has(self.max) || self.max == 0 || !has(self.min) || self.min <= self.max",message="min must not exceed max"
type PoolSpec struct {
	// Template is the pod of every sandbox in the pool.
	Template SandboxTemplate `json:"template"`
	// Min is the least number of pods the pool holds (free plus allocated).
	// +kubebuilder:validation:Minimum=0
	// +optional
	Min int32 `json:"min,omitempty"`
	// Max caps the pods the pool holds (free plus allocated); 0 = no cap.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Max int32 `json:"max,omitempty"`
	// Buffer is the number of free pods kept beyond those allocated, so
	// that the next claim is served warm.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Buffer int32 `json:"buffer,omitempty"`
}

// PoolStatus is what the controller observed of a pool.
type PoolStatus struct {
	// ObservedGeneration is the spec generation the counts are for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Total pods of the pool (free plus allocated, not terminating).
	Total int32 `json:"total"`
	// Free pods: running and not allocated to a batch.
	Free int32 `json:"free"`
	// Allocated pods: handed to a BatchSandbox.
	Allocated int32 `json:"allocated"`
	// Pending pods: created, not running yet.
	Pending int32 `json:"pending"`
}

// Pool keeps warm sandbox pods ready for BatchSandbox claims.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=sbpool
// +kubebuilder:printcolumn:name="Min",type=integer,JSONPath=`.spec.min`
// +kubebuilder:printcolumn:name="Max",type=integer,JSONPath=`.spec.max`
// +kubebuilder:printcolumn:name="Buffer",type=integer,JSONPath=`.spec.buffer`
// +kubebuilder:printcolumn:name="Free",type=integer,JSONPath=`.status.free`
// +kubebuilder:printcolumn:name="Allocated",type=integer,JSONPath=`.status.allocated`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Pool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   PoolSpec   `json:"spec"`
	Status PoolStatus `json:"status,omitempty"`
}

// PoolList is a list of Pools.
//
// +kubebuilder:object:root=true
type PoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Pool `json:"items"`
}

// SandboxPatch changes one claim of a batch. Labels and Annotations are set
// on the pod of a claim created cold; for a claim served warm they stay in
// this spec only (relabelling warm pods would cost one write per pod). Env
// can only be applied at pod creation, so a claim whose patch sets Env is
// always created cold.
type SandboxPatch struct {
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
	// +optional
	Env map[string]string `json:"env,omitempty"`
}

// BatchSandboxSpec is a claim of Replicas sandboxes.
//
// +kubebuilder:validation:XValidation:rule="has(self.poolRef) || has(self.template)",message="one of poolRef or template is required"
// +kubebuilder:validation:XValidation:rule="!has(self.patches) || size(self.patches) <= self.replicas",message="more patches than replicas"
// +kubebuilder:validation:XValidation:rule="self.replicas == oldSelf.replicas",message="replicas is immutable"
type BatchSandboxSpec struct {
	// Replicas is the number of sandboxes.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=5000
	Replicas int32 `json:"replicas"`
	// PoolRef names a Pool in the same namespace to take warm pods from.
	// Claims the pool cannot serve are created cold from Template (or, if
	// Template is empty, from the pool's template).
	// +optional
	PoolRef string `json:"poolRef,omitempty"`
	// Template is the pod of a sandbox created cold.
	// +optional
	Template *SandboxTemplate `json:"template,omitempty"`
	// ExpireTime, if set, is when the controller deletes the batch.
	// +optional
	ExpireTime *metav1.Time `json:"expireTime,omitempty"`
	// Patches[i] applies to claim i.
	// +optional
	// +kubebuilder:validation:MaxItems=5000
	Patches []SandboxPatch `json:"patches,omitempty"`
	// Stopped releases the pods but keeps the batch (and its record).
	// +optional
	Stopped bool `json:"stopped,omitempty"`
}

// BatchPhase summarizes a batch.
// +kubebuilder:validation:Enum=Pending;Running;Stopped;Failed
type BatchPhase string

// Batch phases.
const (
	// BatchPending: some sandboxes are not running yet.
	BatchPending BatchPhase = "Pending"
	// BatchRunning: every sandbox is running.
	BatchRunning BatchPhase = "Running"
	// BatchStopped: the batch was stopped and its pods released.
	BatchStopped BatchPhase = "Stopped"
	// BatchFailed: the batch cannot be served (see Message).
	BatchFailed BatchPhase = "Failed"
)

// Source tells where a sandbox's pod came from.
// +kubebuilder:validation:Enum=Pool;Cold
type Source string

// Pod sources.
const (
	// SourcePool: a warm pod of the batch's pool.
	SourcePool Source = "Pool"
	// SourceCold: a pod created for the batch.
	SourceCold Source = "Cold"
)

// SandboxStatus is one claim of a batch.
type SandboxStatus struct {
	// Index of the claim (0..replicas-1).
	Index int32 `json:"index"`
	// Pod is the name of the sandbox's pod.
	Pod string `json:"pod"`
	// Source of the pod.
	Source Source `json:"source"`
	// IP is the pod IP once it is known.
	// +optional
	IP string `json:"ip,omitempty"`
	// Ready is true once the pod is running with an IP.
	// +optional
	Ready bool `json:"ready,omitempty"`
	// Gone is true once the pod disappeared (deleted or evicted).
	// +optional
	Gone bool `json:"gone,omitempty"`
}

// BatchSandboxStatus is the controller's record of a batch. It is the
// allocation ledger: on restart the controller rebuilds which pool pods are
// taken from the statuses of all batches.
type BatchSandboxStatus struct {
	// ObservedGeneration is the spec generation the status is for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Phase summarizes the batch.
	// +optional
	Phase BatchPhase `json:"phase,omitempty"`
	// Message explains a Failed phase.
	// +optional
	Message string `json:"message,omitempty"`
	// Allocated is the number of claims with a pod.
	Allocated int32 `json:"allocated"`
	// Ready is the number of claims whose pod is running.
	Ready int32 `json:"ready"`
	// Sandboxes are the claims, by index.
	// +optional
	// +listType=map
	// +listMapKey=index
	Sandboxes []SandboxStatus `json:"sandboxes,omitempty"`
}

// BatchSandbox claims a number of sandboxes at once.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=bsbx
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.ready`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.poolRef`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type BatchSandbox struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   BatchSandboxSpec   `json:"spec"`
	Status BatchSandboxStatus `json:"status,omitempty"`
}

// BatchSandboxList is a list of BatchSandboxes.
//
// +kubebuilder:object:root=true
type BatchSandboxList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BatchSandbox `json:"items"`
}
