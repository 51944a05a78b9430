//! Users, tokens and projects made the way a person makes them: through `UserService` and
//! `ProjectService` with the stack's admin token (never through the store).

use kiln_proto::v1::node_service_client::NodeServiceClient;
use kiln_proto::v1::project_service_client::ProjectServiceClient;
use kiln_proto::v1::user_service_client::UserServiceClient;

use super::*;

impl Stack {
    pub async fn users_as(&self, token: &str) -> UserServiceClient<Authed> {
        UserServiceClient::with_interceptor(Self::channel(self.api_addr).await, BearerInterceptor::new(token))
    }

    pub async fn projects_as(&self, token: &str) -> ProjectServiceClient<Authed> {
        ProjectServiceClient::with_interceptor(Self::channel(self.api_addr).await, BearerInterceptor::new(token))
    }

    /// `NodeService` of the service at `addr`, as the owner of `token`.
    pub async fn node_as(&self, addr: SocketAddr, token: &str) -> NodeServiceClient<Authed> {
        NodeServiceClient::with_interceptor(Self::channel(addr).await, BearerInterceptor::new(token))
    }

    /// Makes a user (not an admin) and returns their first token.
    pub async fn create_user(&self, name: &str) -> String {
        self.users_as(&self.token)
            .await
            .create_user(pb::CreateUserRequest {
                name: name.into(),
                admin: false,
            })
            .await
            .expect("create user")
            .into_inner()
            .token
    }

    /// Makes a project.
    pub async fn create_project(&self, name: &str) {
        self.projects_as(&self.token)
            .await
            .create_project(pb::CreateProjectRequest { name: name.into() })
            .await
            .expect("create project");
    }

    /// Gives a user a role in a project.
    pub async fn add_member(&self, project: &str, user: &str, role: pb::Role) {
        self.projects_as(&self.token)
            .await
            .add_member(pb::AddMemberRequest {
                project: project.into(),
                user: user.into(),
                role: role as i32,
            })
            .await
            .expect("add member");
    }

    /// Makes a user who is a member of the `default` project, and returns their token.
    pub async fn member(&self, name: &str) -> String {
        let token = self.create_user(name).await;
        self.add_member("default", name, pb::Role::Member).await;
        token
    }
}
