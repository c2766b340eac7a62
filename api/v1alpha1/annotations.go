package v1alpha1

import "encoding/json"

// AllocatedPods returns the pods of a batch's claims, in claim order, from
// its alloc-status annotation ("" for a claim without a pod; nil when the
// batch has no record yet or it cannot be read).
func (b *BatchSandbox) AllocatedPods() []string {
	var st struct {
		Pods []string `json:"pods"`
	}
	if json.Unmarshal([]byte(b.Annotations[AnnoAllocStatus]), &st) != nil {
		return nil
	}
	return st.Pods
}

// Endpoints returns the pod IPs of a batch's claims, in claim order, from
// its endpoints annotation ("" for a claim whose pod has no IP yet).
func (b *BatchSandbox) Endpoints() []string {
	var ips []string
	if json.Unmarshal([]byte(b.Annotations[AnnoEndpoints]), &ips) != nil {
		return nil
	}
	return ips
}

// Condition returns the batch's condition of type t, if it has one.
func (b *BatchSandbox) Condition(t BatchSandboxConditionType) (BatchSandboxCondition, bool) {
	return b.Status.Condition(t)
}

// Condition returns the status's condition of type t, if it has one.
func (s *BatchSandboxStatus) Condition(t BatchSandboxConditionType) (BatchSandboxCondition, bool) {
	for _, c := range s.Conditions {
		if c.Type == t {
			return c, true
		}
	}
	return BatchSandboxCondition{}, false
}
