/*
 * kvcast TNA: the architecture's port fields and egress types under the names the shared
 * controls (p4src/shared/control) use.
 */
#ifndef _KVCAST_TNA_ARCH_P4_
#define _KVCAST_TNA_ARCH_P4_

// A port number, as action parameters carry it.
#define KVCAST_PORT_T PortId_t
// The metadata ingress writes the unicast egress port into, and that field.
#define KVCAST_TM_MD_T ingress_intrinsic_metadata_for_tm_t
#define KVCAST_UCAST_PORT(md) md.ucast_egress_port
// Egress parses the packet again into headers and metadata of its own (metadata.p4).
#define KVCAST_EG_HEADERS_T egress_headers_t
#define KVCAST_EG_METADATA_T egress_metadata_t

#endif  // _KVCAST_TNA_ARCH_P4_
