/* PortRole: which ingress ports face pool nodes (allowed to multicast DATA to a group). */
#ifndef _KVCAST_TNA_PORT_ROLE_P4_
#define _KVCAST_TNA_PORT_ROLE_P4_

control PortRole(inout local_metadata_t meta, in PortId_t ingress_port) {
    action set_port_role(bit<8> role) {
        meta.port_role = role;
    }

    table port_role {
        key = { ingress_port: exact @name("port"); }
        actions = { set_port_role; }
        // An unknown port is a host port: it may read the cache but not feed a group.
        default_action = set_port_role(PORT_ROLE_HOST);
        size = PORT_ENTRIES;
    }

    apply {
        port_role.apply();
    }
}

#endif  // _KVCAST_TNA_PORT_ROLE_P4_
