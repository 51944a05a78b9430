//! `ProjectService`: projects (made by the admin) and their members (managed by maintainers).

use kiln_core::authz::{Caller, Role};
use kiln_core::events::stop_owner_jobs;
use kiln_core::store::{MemberRecord, Store};
use kiln_core::streams::Nats;
use kiln_core::subjects;
use kiln_proto::v1 as pb;
use kiln_proto::v1::project_service_server::ProjectService;
use tonic::{Request, Response, Status};

use crate::access;
use crate::error::{Error, Result};

/// ProjectsApi serves `ProjectService`.
#[derive(Clone)]
pub struct ProjectsApi {
    pub(crate) store: Store,
    pub(crate) nats: Nats,
}

fn member_to_proto(member: MemberRecord) -> pb::Member {
    pb::Member {
        project: member.project,
        user: member.user_name,
        role: member.role.to_proto() as i32,
    }
}

impl ProjectsApi {
    async fn create(&self, name: &str) -> Result<pb::Project> {
        subjects::validate_token("project", name).map_err(Error::InvalidArgument)?;
        if self.store.project(name).await?.is_some() {
            return Err(Error::Exists {
                what: "project",
                name: name.to_string(),
            });
        }
        let project = self.store.create_project(name).await?;
        tracing::info!(project = %project.name, "project created");
        Ok(pb::Project {
            name: project.name,
            created_at_ms: project.created_at_ms,
            role: pb::Role::Unspecified as i32,
        })
    }

    async fn list(&self, caller: &Caller) -> Result<Vec<pb::Project>> {
        let roles = &caller.principal.roles;
        let visible = caller.visible_projects();
        Ok(self
            .store
            .list_projects()
            .await?
            .into_iter()
            .filter(|project| visible.contains(&project.name))
            .map(|project| pb::Project {
                role: roles
                    .get(&project.name)
                    .map_or(pb::Role::Unspecified, |role| role.to_proto()) as i32,
                name: project.name,
                created_at_ms: project.created_at_ms,
            })
            .collect())
    }

    /// The user a membership call names.
    async fn member_user(&self, name: &str) -> Result<kiln_core::store::entities::user::Model> {
        subjects::validate_token("user", name).map_err(Error::InvalidArgument)?;
        self.store
            .user_by_name(name)
            .await?
            .ok_or_else(|| Error::UserNotFound { name: name.to_string() })
    }

    async fn add_member(&self, caller: &Caller, request: pb::AddMemberRequest) -> Result<pb::Member> {
        let project = access::project(&self.store, caller, &request.project).await?;
        let role = Role::from_proto(request.role)
            .ok_or_else(|| Error::InvalidArgument("role must be viewer, member or maintainer".into()))?;
        let user = self.member_user(&request.user).await?;
        self.store.set_member(&project, &user.id, role).await?;
        tracing::info!(%project, user = %user.name, %role, by = %caller.principal.user_name, "member set");
        if role < Role::Member && !user.is_admin {
            // A viewer runs nothing: their jobs here stop, and their sweeps, services and
            // batches here pause on their controllers' next pass.
            let reason = format!("owner {} is only a viewer of project {project}", user.name);
            let stopped = stop_owner_jobs(&self.nats, &self.store, &user.id, Some(&project), &reason).await?;
            tracing::info!(%project, user = %user.name, stopped, "jobs of a member made viewer stopped");
        }
        Ok(pb::Member {
            project,
            user: user.name,
            role: role.to_proto() as i32,
        })
    }

    async fn remove_member(&self, caller: &Caller, request: pb::RemoveMemberRequest) -> Result<()> {
        let project = access::project(&self.store, caller, &request.project).await?;
        let user = self.member_user(&request.user).await?;
        if !self.store.remove_member(&project, &user.id).await? {
            return Err(Error::NotFound(format!(
                "{} is no member of project {project}",
                user.name
            )));
        }
        // Nothing of theirs runs here any more: their jobs stop, and their sweeps, services and
        // batches here pause on their controllers' next pass (their next job insert is refused
        // by the same check, `Store::check_owner`). An instance admin needs no membership.
        let stopped = if user.is_admin {
            0
        } else {
            let reason = format!("owner {} is no longer a member of project {project}", user.name);
            stop_owner_jobs(&self.nats, &self.store, &user.id, Some(&project), &reason).await?
        };
        tracing::info!(%project, user = %user.name, by = %caller.principal.user_name, stopped, "member removed");
        Ok(())
    }
}

#[tonic::async_trait]
impl ProjectService for ProjectsApi {
    #[tracing::instrument(skip_all, fields(project = %request.get_ref().name))]
    async fn create_project(
        &self,
        request: Request<pb::CreateProjectRequest>,
    ) -> Result<Response<pb::Project>, Status> {
        Ok(Response::new(self.create(&request.get_ref().name).await?))
    }

    #[tracing::instrument(skip_all)]
    async fn list_projects(
        &self,
        request: Request<pb::ListProjectsRequest>,
    ) -> Result<Response<pb::ListProjectsResponse>, Status> {
        let caller = access::caller(&request)?;
        Ok(Response::new(pb::ListProjectsResponse {
            projects: self.list(&caller).await?,
        }))
    }

    #[tracing::instrument(skip_all, fields(project = %request.get_ref().name))]
    async fn list_members(
        &self,
        request: Request<pb::ProjectRef>,
    ) -> Result<Response<pb::ListMembersResponse>, Status> {
        let caller = access::caller(&request)?;
        let project = access::project(&self.store, &caller, &request.get_ref().name).await?;
        let members = self.store.members(&project).await.map_err(Error::from)?;
        Ok(Response::new(pb::ListMembersResponse {
            members: members.into_iter().map(member_to_proto).collect(),
        }))
    }

    #[tracing::instrument(skip_all, fields(project = %request.get_ref().project))]
    async fn add_member(&self, request: Request<pb::AddMemberRequest>) -> Result<Response<pb::Member>, Status> {
        let caller = access::caller(&request)?;
        Ok(Response::new(self.add_member(&caller, request.into_inner()).await?))
    }

    #[tracing::instrument(skip_all, fields(project = %request.get_ref().project))]
    async fn remove_member(
        &self,
        request: Request<pb::RemoveMemberRequest>,
    ) -> Result<Response<pb::RemoveMemberResponse>, Status> {
        let caller = access::caller(&request)?;
        self.remove_member(&caller, request.into_inner()).await?;
        Ok(Response::new(pb::RemoveMemberResponse {}))
    }
}
