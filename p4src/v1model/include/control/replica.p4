/* ReplicaRewrite (v1model): the shared control (p4src/shared/control/replica.p4). */
#ifndef _KVCAST_REPLICA_P4_
#define _KVCAST_REPLICA_P4_

#include "v1model/include/arch.p4"
#include "shared/control/replica.p4"

#endif  // _KVCAST_REPLICA_P4_
