package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Annotations clients read on a BatchSandbox, as OpenSandbox's controller
// writes them, and the labels and finalizer the controller puts on the
// objects it makes.
const (
	// AnnoAllocStatus is the allocation record of a batch:
	// {"pods":["pod-of-claim-0","pod-of-claim-1",...]} in claim order
	// ("" for a claim without a pod yet). With AnnoAllocRelease it is the
	// ledger: a restarted controller rebuilds which pool pods are taken
	// from these two annotations of every batch.
	AnnoAllocStatus = Group + "/alloc-status"
	// AnnoAllocRelease lists the pods a batch released before the batch
	// ended (deleted or finished pods that were replaced, or claims beyond
	// a lowered spec.replicas): {"pods":[...]}.
	AnnoAllocRelease = Group + "/alloc-release"
	// AnnoEndpoints are the pod IPs of the claims, in claim order:
	// ["10.244.1.5", ...] ("" for a claim whose pod has no IP yet).
	AnnoEndpoints = Group + "/endpoints"
	// AnnoPoolName names the pool a batch's warm pods came from.
	AnnoPoolName = Group + "/pool-name"

	// LabelPool marks a pod made by a Pool; its value is the pool name.
	// Warm pods handed to a batch are not relabelled (that would cost one
	// write per pod): the batch's alloc-status is the record.
	LabelPool = "pool." + Group + "/name"
	// LabelPoolRevision is the hash of the pool template a pod was made
	// from, so that a pool can tell stale pods after a template change.
	LabelPoolRevision = Group + "/pool-revision"
	// LabelBatch marks a pod created for a BatchSandbox; its value is the
	// batch name.
	LabelBatch = "batch-sandbox." + Group + "/name"
	// LabelPodIndex is the claim index of a pod created for a batch.
	LabelPodIndex = "batch-sandbox." + Group + "/pod-index"
	// LabelManaged is on every pod the controller makes; the controller's
	// pod cache is restricted to it.
	LabelManaged = Group + "/managed-by"
	// ManagedBy is the value of LabelManaged.
	ManagedBy = "moat"

	// AnnoAgent set to "false" on a pod template keeps the controller from
	// injecting moat's agent into the pods made from it.
	AnnoAgent = Group + "/moat-agent"
	// AnnoAgentImage on a pod template overrides the controller's
	// --agent-image for the pods made from it.
	AnnoAgentImage = Group + "/moat-agent-image"
	// AnnoEgress on a pod template names a Secret of its namespace that
	// holds an egress policy (keys EgressSecret*): the controller adds
	// moat's egress sidecar, which enforces it inside the pod.
	AnnoEgress = Group + "/moat-egress"
	// EgressSecretToken, EgressSecretPolicy and EgressSecretDNS are the
	// keys of an AnnoEgress Secret: the egress API token, the policy the
	// pod starts under (JSON) and the DNS upstreams ("host:port,...").
	EgressSecretToken  = "egress-token"
	EgressSecretPolicy = "egress-policy"
	EgressSecretDNS    = "egress-dns"
	// EgressSecretVaultKey (optional, hex) is the pod's Credential Vault
	// key: with it the sidecar runs the credential proxy, and the server
	// seals what it pushes to it under this key.
	EgressSecretVaultKey = "egress-vault-key"

	// FinalizerRelease keeps a BatchSandbox (and a Pool) until the
	// controller has released its pods; without it a pod could be handed
	// out again after a controller restart (OpenSandbox's #723).
	FinalizerRelease = Group + "/release"
)

// CapacitySpec sizes a pool. The controller keeps the free (available)
// pods between BufferMin and BufferMax: below BufferMin it creates pods
// up to BufferMax, above BufferMax it deletes the surplus; the pool's
// total (free plus allocated) stays within [PoolMin, PoolMax].
//
// +kubebuilder:validation:XValidation:rule="self.bufferMin <= self.bufferMax",message="bufferMin must not exceed bufferMax"
// +kubebuilder:validation:XValidation:rule="self.poolMin <= self.poolMax",message="poolMin must not exceed poolMax"
type CapacitySpec struct {
	// BufferMax is the most free pods kept ready.
	// +kubebuilder:validation:Minimum=0
	BufferMax int32 `json:"bufferMax"`
	// BufferMin is the fewest free pods kept ready.
	// +kubebuilder:validation:Minimum=0
	BufferMin int32 `json:"bufferMin"`
	// PoolMax caps the pool's pods (free plus allocated).
	// +kubebuilder:validation:Minimum=0
	PoolMax int32 `json:"poolMax"`
	// PoolMin is the fewest pods the pool holds (free plus allocated).
	// +kubebuilder:validation:Minimum=0
	PoolMin int32 `json:"poolMin"`
}

// ScaleStrategy paces scaling (accepted for compatibility).
type ScaleStrategy struct {
	// MaxUnavailable pods while scaling (a number or a percentage).
	// +optional
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
}

// UpdateStrategy paces the replacement of stale pods after a template
// change (accepted for compatibility; moat replaces free stale pods at once).
type UpdateStrategy struct {
	// MaxUnavailable pods while updating (a number or a percentage).
	// +optional
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
}

// RecycleStrategy says what happens to an allocated pod when its batch
// ends.
type RecycleStrategy struct {
	// Type: Delete (the default and the only one moat implements: a used
	// sandbox is never handed out again), Restart or Noop.
	// +kubebuilder:validation:Enum=Delete;Restart;Noop
	// +optional
	Type string `json:"type,omitempty"`
}

// PodRecyclePolicy says how allocated pods are handled when their batch is
// deleted: Delete (default) or Reuse. moat always deletes: a used sandbox
// is dirty; Reuse is accepted and treated as Delete.
// +kubebuilder:validation:Enum=Delete;Reuse
type PodRecyclePolicy string

// ResetSpec configures PodRecyclePolicy Reuse (accepted for compatibility).
type ResetSpec struct {
	// +optional
	MainContainerName string `json:"mainContainerName,omitempty"`
	// +optional
	CleanDirectories []string `json:"cleanDirectories,omitempty"`
	// +optional
	TimeoutSeconds int64 `json:"timeoutSeconds,omitempty"`
}

// PoolSpec describes a pool of warm sandbox pods.
type PoolSpec struct {
	// Template is the pod of every sandbox in the pool. Unless its
	// annotation sandbox.opensandbox.io/moat-agent is "false", the
	// controller adds moat's agent to the pod (an init container copies it
	// into an emptyDir; the first container runs it, with the container's
	// own command, if any, as the agent's child).
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:validation:Optional
	Template *corev1.PodTemplateSpec `json:"template"`
	// CapacitySpec sizes the pool.
	CapacitySpec CapacitySpec `json:"capacitySpec"`
	// +optional
	ScaleStrategy *ScaleStrategy `json:"scaleStrategy,omitempty"`
	// +optional
	UpdateStrategy *UpdateStrategy `json:"updateStrategy,omitempty"`
	// +optional
	RecycleStrategy *RecycleStrategy `json:"recycleStrategy,omitempty"`
	// +optional
	PodRecyclePolicy PodRecyclePolicy `json:"podRecyclePolicy,omitempty"`
	// +optional
	ResetSpec *ResetSpec `json:"resetSpec,omitempty"`
}

// PoolStatus is what the controller observed of a pool.
type PoolStatus struct {
	// ObservedGeneration is the spec generation the counts are for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Revision is the hash of the current template.
	Revision string `json:"revision"`
	// Total pods of the pool (free, allocated and starting).
	Total int32 `json:"total"`
	// Allocated pods: handed to a BatchSandbox.
	Allocated int32 `json:"allocated"`
	// Available pods: running, of the current revision, not allocated.
	Available int32 `json:"available"`
	// Updated pods: of the current revision.
	// +optional
	Updated int32 `json:"updated,omitempty"`
	// Resetting is always 0 (moat never reuses a pod).
	// +optional
	Resetting int32 `json:"resetting,omitempty"`
	// Conditions: Ready (False with a reason for a template the controller
	// cannot use).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Pool keeps warm sandbox pods ready for BatchSandbox claims.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="TOTAL",type=integer,JSONPath=`.status.total`
// +kubebuilder:printcolumn:name="ALLOCATED",type=integer,JSONPath=`.status.allocated`
// +kubebuilder:printcolumn:name="AVAILABLE",type=integer,JSONPath=`.status.available`
// +kubebuilder:printcolumn:name="AGE",type=date,JSONPath=`.metadata.creationTimestamp`
type Pool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   PoolSpec   `json:"spec,omitempty"`
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

// TaskResourcePolicy says what happens to a sandbox whose task finished.
// +kubebuilder:validation:Enum=Retain;Release
type TaskResourcePolicy string

// Task resource policies.
const (
	// TaskRetain keeps the sandbox until the batch is deleted.
	TaskRetain TaskResourcePolicy = "Retain"
	// TaskRelease deletes the sandbox's pod once its task finished.
	TaskRelease TaskResourcePolicy = "Release"
)

// ProcessTask is a command run in a sandbox.
type ProcessTask struct {
	// Command to run (argv[0] and the first arguments).
	Command []string `json:"command"`
	// Args are appended to Command.
	// +optional
	Args []string `json:"args,omitempty"`
	// Env of the task (literal values).
	// +optional
	Env []corev1.EnvVar `json:"env,omitempty"`
	// WorkingDir of the task.
	// +optional
	WorkingDir string `json:"workingDir,omitempty"`
}

// TaskSpec is the task of one sandbox.
type TaskSpec struct {
	// +optional
	Process *ProcessTask `json:"process,omitempty"`
	// TimeoutSeconds bounds the task; a task past it is killed and failed.
	// +optional
	TimeoutSeconds *int64 `json:"timeoutSeconds,omitempty"`
}

// TaskTemplateSpec is the task every sandbox of a batch runs once it is
// ready (moat's agent in the pod runs it; no sidecar).
type TaskTemplateSpec struct {
	// +optional
	Spec TaskSpec `json:"spec,omitempty"`
}

// SnapshotType is the kind of a snapshot.
type SnapshotType string

// PausePolicy configures pause (accepted for compatibility).
type PausePolicy struct {
	SnapshotRegistry string `json:"snapshotRegistry"`
	// +optional
	SnapshotType SnapshotType `json:"snapshotType,omitempty"`
	// +optional
	SnapshotPushSecret string `json:"snapshotPushSecret,omitempty"`
	// +optional
	ResumeImagePullSecret string `json:"resumeImagePullSecret,omitempty"`
}

// BatchSandboxSpec is a claim of Replicas sandboxes.
type BatchSandboxSpec struct {
	// Replicas is the number of sandboxes. Lowering it releases the
	// claims past the new count; raising it adds claims.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	// +kubebuilder:default=1
	Replicas *int32 `json:"replicas,omitempty"`
	// PoolRef names a Pool in the same namespace to take warm pods from.
	// Claims the pool cannot serve are created from Template, or, without
	// one, from the pool's template.
	// +optional
	PoolRef string `json:"poolRef,omitempty"`
	// Template is the pod of a sandbox created for the batch (see
	// PoolSpec.Template for the agent).
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:validation:Optional
	Template *corev1.PodTemplateSpec `json:"template,omitempty"`
	// ShardPatches[i] is a strategic merge patch on the template for
	// claim i. A claim with a patch gets a pod of its own (a warm pod's
	// spec cannot change).
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Schemaless
	// +optional
	ShardPatches []runtime.RawExtension `json:"shardPatches,omitempty"`
	// ExpireTime is when the controller deletes the batch (a time in the
	// past: at once).
	// +optional
	ExpireTime *metav1.Time `json:"expireTime,omitempty"`
	// TaskTemplate is run in every sandbox once it is ready.
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Schemaless
	// +optional
	TaskTemplate *TaskTemplateSpec `json:"taskTemplate,omitempty"`
	// ShardTaskPatches[i] is a JSON merge patch on TaskTemplate for claim i.
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Schemaless
	// +optional
	ShardTaskPatches []runtime.RawExtension `json:"shardTaskPatches,omitempty"`
	// TaskResourcePolicyWhenCompleted: Retain (default) keeps a sandbox
	// whose task finished; Release deletes its pod.
	// +kubebuilder:default=Retain
	// +optional
	TaskResourcePolicyWhenCompleted *TaskResourcePolicy `json:"taskResourcePolicyWhenCompleted,omitempty"`
	// Pause: nil = nothing to do, true = pause, false = resume. moat
	// freezes the sandboxes' containers where they run (moat node on
	// each pod's node), memory and pods kept; status.phase goes Pausing,
	// Paused, Resuming, and a pause the nodes do not confirm is undone
	// (PauseFailed).
	// +optional
	Pause *bool `json:"pause,omitempty"`
	// PausePolicy is accepted for compatibility.
	// +optional
	PausePolicy *PausePolicy `json:"pausePolicy,omitempty"`
}

// BatchSandboxPhase summarizes a batch.
// +kubebuilder:validation:Enum=Pending;Succeed;Pausing;Paused;Resuming;Failed
type BatchSandboxPhase string

// Batch phases (OpenSandbox's).
const (
	// PhasePending: some sandboxes are not running yet.
	PhasePending BatchSandboxPhase = "Pending"
	// PhaseSucceed: every sandbox is running (clients map it to Running).
	PhaseSucceed BatchSandboxPhase = "Succeed"
	// PhasePausing, PhasePaused, PhaseResuming: the pause chain.
	PhasePausing  BatchSandboxPhase = "Pausing"
	PhasePaused   BatchSandboxPhase = "Paused"
	PhaseResuming BatchSandboxPhase = "Resuming"
	// PhaseFailed: the batch cannot be served (see the conditions).
	PhaseFailed BatchSandboxPhase = "Failed"
)

// BatchSandboxConditionType names a condition of a batch.
// +kubebuilder:validation:Enum=Ready;Progressing;Paused;PauseFailed;ResumeFailed;PodFailed
type BatchSandboxConditionType string

// Condition types (OpenSandbox's).
const (
	ConditionReady        BatchSandboxConditionType = "Ready"
	ConditionProgressing  BatchSandboxConditionType = "Progressing"
	ConditionPaused       BatchSandboxConditionType = "Paused"
	ConditionPauseFailed  BatchSandboxConditionType = "PauseFailed"
	ConditionResumeFailed BatchSandboxConditionType = "ResumeFailed"
	ConditionPodFailed    BatchSandboxConditionType = "PodFailed"
)

// Condition reasons the controller writes.
const (
	// ReasonAllReady: Ready=True.
	ReasonAllReady = "AllReady"
	// ReasonPodsStarting: Ready=False while pods start.
	ReasonPodsStarting = "PodsStarting"
	// ReasonPoolNotFound: Ready=False, poolRef names no Pool and there is
	// no template to fall back on.
	ReasonPoolNotFound = "PoolNotFound"
	// ReasonInvalidTemplate: Ready=False, the template (or a shard patch)
	// cannot make a pod, e.g. it has no container image.
	ReasonInvalidTemplate = "InvalidTemplate"
	// ReasonCreateFailed: Ready=False, the API server refused a pod.
	ReasonCreateFailed = "PodCreateFailed"
	// ReasonUnsupported: a SandboxSnapshot's Failed.
	ReasonUnsupported = "Unsupported"
	// ReasonPodsFailed: PodFailed=True, some pods ended.
	ReasonPodsFailed = "PodsFailed"
)

// BatchSandboxCondition is a condition of a batch (OpenSandbox's shape).
type BatchSandboxCondition struct {
	Type BatchSandboxConditionType `json:"type"`
	// +kubebuilder:validation:Enum=True;False
	Status string `json:"status"`
	// +optional
	Reason string `json:"reason,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
	// +optional
	LastTransitionTime *metav1.Time `json:"lastTransitionTime,omitempty"`
}

// BatchSandboxStatus is what the controller observed of a batch. The
// allocation itself is recorded in the alloc-status annotation.
type BatchSandboxStatus struct {
	// ObservedGeneration is the spec generation the status is for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Replicas is the number of pods the batch has.
	Replicas int32 `json:"replicas"`
	// Allocated is the number of claims with a pod.
	Allocated int32 `json:"allocated"`
	// Ready is the number of claims whose pod runs with an IP.
	Ready int32 `json:"ready"`
	// Task counts (tasks of claims without a ready pod are pending).
	TaskRunning int32 `json:"taskRunning"`
	TaskSucceed int32 `json:"taskSucceed"`
	TaskFailed  int32 `json:"taskFailed"`
	TaskPending int32 `json:"taskPending"`
	TaskUnknown int32 `json:"taskUnknown"`
	// TaskLastErrorMessage is the error of the latest failed task.
	// +optional
	TaskLastErrorMessage string `json:"taskLastErrorMessage,omitempty"`
	// Phase summarizes the batch.
	// +optional
	Phase BatchSandboxPhase `json:"phase,omitempty"`
	// PauseObservedGeneration is the generation whose spec.pause the
	// controller last answered.
	// +optional
	PauseObservedGeneration int64 `json:"pauseObservedGeneration,omitempty"`
	// Conditions: Ready, PodFailed, Paused, Progressing (a pause or
	// resume in flight), PauseFailed, ResumeFailed.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []BatchSandboxCondition `json:"conditions,omitempty"`
}

// BatchSandbox claims a number of sandboxes at once.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=bsbx
// +kubebuilder:printcolumn:name="DESIRED",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="TOTAL",type=integer,JSONPath=`.status.replicas`
// +kubebuilder:printcolumn:name="ALLOCATED",type=integer,JSONPath=`.status.allocated`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.ready`
// +kubebuilder:printcolumn:name="PHASE",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="TASK_SUCCEED",type=integer,priority=1,JSONPath=`.status.taskSucceed`
// +kubebuilder:printcolumn:name="TASK_FAILED",type=integer,priority=1,JSONPath=`.status.taskFailed`
// +kubebuilder:printcolumn:name="EXPIRE",type=string,JSONPath=`.spec.expireTime`
// +kubebuilder:printcolumn:name="AGE",type=date,JSONPath=`.metadata.creationTimestamp`
type BatchSandbox struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   BatchSandboxSpec   `json:"spec,omitempty"`
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

// GetReplicas returns spec.replicas (default 1).
func (b *BatchSandbox) GetReplicas() int32 {
	if b.Spec.Replicas == nil {
		return 1
	}
	return *b.Spec.Replicas
}

// SandboxSnapshotPhase is the phase of a snapshot.
// +kubebuilder:validation:Enum=Pending;Committing;Succeed;Ready;Failed
type SandboxSnapshotPhase string

// Snapshot phases.
const (
	SnapshotPending    SandboxSnapshotPhase = "Pending"
	SnapshotCommitting SandboxSnapshotPhase = "Committing"
	SnapshotSucceed    SandboxSnapshotPhase = "Succeed"
	SnapshotFailed     SandboxSnapshotPhase = "Failed"
)

// ContainerSnapshot is the image of one snapshotted container.
type ContainerSnapshot struct {
	ContainerName string `json:"containerName"`
	ImageURI      string `json:"imageUri"`
	// +optional
	ImageDigest string `json:"imageDigest,omitempty"`
}

// SandboxSnapshotSpec names the sandbox to snapshot. The other fields are
// those of OpenSandbox's releases, accepted for compatibility.
type SandboxSnapshotSpec struct {
	// SandboxName is the BatchSandbox to snapshot.
	// +optional
	SandboxName string `json:"sandboxName,omitempty"`
	// +optional
	SandboxID string `json:"sandboxId,omitempty"`
	// +optional
	SourceBatchSandboxName string `json:"sourceBatchSandboxName,omitempty"`
	// +optional
	SourcePodName string `json:"sourcePodName,omitempty"`
	// +optional
	SourceNodeName string `json:"sourceNodeName,omitempty"`
	// +optional
	SnapshotType SnapshotType `json:"snapshotType,omitempty"`
	// +optional
	SnapshotRegistry string `json:"snapshotRegistry,omitempty"`
	// +optional
	SnapshotPushSecret string `json:"snapshotPushSecret,omitempty"`
	// +optional
	ResumeImagePullSecret string `json:"resumeImagePullSecret,omitempty"`
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Schemaless
	// +optional
	ResumeTemplate *runtime.RawExtension `json:"resumeTemplate,omitempty"`
	// +optional
	ContainerSnapshots []ContainerSnapshot `json:"containerSnapshots,omitempty"`
	// +optional
	PausedAt *metav1.Time `json:"pausedAt,omitempty"`
	// +optional
	PauseVersion int `json:"pauseVersion,omitempty"`
	// +optional
	ResumeVersion int `json:"resumeVersion,omitempty"`
}

// SandboxSnapshotStatus is the controller's answer to a snapshot request.
type SandboxSnapshotStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	Phase SandboxSnapshotPhase `json:"phase,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
	// +optional
	Containers []ContainerSnapshot `json:"containers,omitempty"`
	// +optional
	SourcePodName string `json:"sourcePodName,omitempty"`
	// +optional
	SourceNodeName string `json:"sourceNodeName,omitempty"`
	// Conditions: Ready, Failed.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// SandboxSnapshot asks for a snapshot of a sandbox.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=sbxsnap
// +kubebuilder:printcolumn:name="PHASE",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="SANDBOX",type=string,JSONPath=`.spec.sandboxName`
// +kubebuilder:printcolumn:name="AGE",type=date,JSONPath=`.metadata.creationTimestamp`
type SandboxSnapshot struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SandboxSnapshotSpec   `json:"spec,omitempty"`
	Status SandboxSnapshotStatus `json:"status,omitempty"`
}

// SandboxSnapshotList is a list of SandboxSnapshots.
//
// +kubebuilder:object:root=true
type SandboxSnapshotList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxSnapshot `json:"items"`
}
