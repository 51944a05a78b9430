//! `NodeService`, served by every kiln service: who the caller is, as that service sees it. It
//! gives each service one authenticated RPC, so a revoked token can be seen failing everywhere.

use kiln_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::auth::{Scope, denied_status};
use crate::authz::Caller;

/// NodeApi answers `WhoAmI` for the service it is part of.
#[derive(Debug, Clone, Copy)]
pub struct NodeApi {
    service: &'static str,
}

impl NodeApi {
    pub fn new(service: &'static str) -> NodeApi {
        NodeApi { service }
    }

    /// The gRPC service, ready to add to a server.
    pub fn server(self) -> pb::node_service_server::NodeServiceServer<NodeApi> {
        pb::node_service_server::NodeServiceServer::new(self)
    }
}

#[tonic::async_trait]
impl pb::node_service_server::NodeService for NodeApi {
    async fn who_am_i(&self, request: Request<pb::WhoAmIRequest>) -> Result<Response<pb::WhoAmIResponse>, Status> {
        let caller = Caller::of(&request).map_err(|denied| denied_status(&denied))?;
        let principal = caller.principal;
        let job_id = match &principal.scope {
            Scope::Job(job_id) => job_id.clone(),
            Scope::User | Scope::Login => String::new(),
        };
        Ok(Response::new(pb::WhoAmIResponse {
            memberships: principal
                .roles
                .iter()
                .map(|(project, role)| pb::Member {
                    project: project.clone(),
                    user: principal.user_name.clone(),
                    role: role.to_proto() as i32,
                })
                .collect(),
            user: principal.user_name,
            user_id: principal.user_id,
            admin: principal.is_admin,
            token_name: principal.token_name,
            job_id,
            service: self.service.to_string(),
        }))
    }
}
