/*
 * kvcast v1model: the architecture's port fields and egress types under the names the shared
 * controls (p4src/shared/control) use.
 */
#ifndef _KVCAST_ARCH_P4_
#define _KVCAST_ARCH_P4_

// A port number, as action parameters carry it.
#define KVCAST_PORT_T bit<9>
// The metadata ingress writes the unicast egress port into, and that field.
#define KVCAST_TM_MD_T standard_metadata_t
#define KVCAST_UCAST_PORT(md) md.egress_spec
// Egress sees the ingress headers and metadata.
#define KVCAST_EG_HEADERS_T headers_t
#define KVCAST_EG_METADATA_T local_metadata_t

#endif  // _KVCAST_ARCH_P4_
