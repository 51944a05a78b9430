//! `UserService`: users (made, listed and disabled by the admin) and every user's own tokens.

use kiln_core::authz::{Caller, Need, Resource, Role};
use kiln_core::events::stop_owner_jobs;
use kiln_core::ids::now_ms;
use kiln_core::store::entities::{api_token, user};
use kiln_core::store::{Store, TokenGrant};
use kiln_core::streams::Nats;
use kiln_core::subjects;
use kiln_proto::v1 as pb;
use kiln_proto::v1::user_service_server::UserService;
use tonic::{Request, Response, Status};

use crate::access;
use crate::error::{Error, Result};

/// The longest a token may live: ten years.
const MAX_EXPIRY_SECS: u64 = 10 * 365 * 24 * 3600;

/// UsersApi serves `UserService`.
#[derive(Clone)]
pub struct UsersApi {
    pub(crate) store: Store,
    pub(crate) nats: Nats,
}

pub(crate) fn user_to_proto(user: user::Model) -> pb::User {
    pb::User {
        id: user.id,
        name: user.name,
        admin: user.is_admin,
        disabled: user.disabled,
        created_at_ms: user.created_at_ms,
    }
}

fn token_to_proto(token: api_token::Model, user_name: &str) -> pb::Token {
    let now = now_ms();
    pb::Token {
        id: token.id,
        name: token.name,
        user: user_name.to_string(),
        created_at_ms: token.created_at_ms,
        last_used_at_ms: token.last_used_at_ms.unwrap_or(0),
        expires_at_ms: token.expires_at_ms.unwrap_or(0),
        revoked: token.revoked || token.expires_at_ms.is_some_and(|at| at <= now),
        role: Role::parse(&token.role).map_or(pb::Role::Unspecified, Role::to_proto) as i32,
        project: token.project,
    }
}

/// Checks a user's or a token's name.
fn validate_name(what: &str, name: &str) -> Result<()> {
    subjects::validate_token(what, name).map_err(Error::InvalidArgument)
}

impl UsersApi {
    async fn user_named(&self, name: &str) -> Result<user::Model> {
        validate_name("user", name)?;
        self.store
            .user_by_name(name)
            .await?
            .ok_or_else(|| Error::UserNotFound { name: name.to_string() })
    }

    async fn create_user(&self, request: pb::CreateUserRequest) -> Result<pb::CreateUserResponse> {
        validate_name("user", &request.name)?;
        if self.store.user_by_name(&request.name).await?.is_some() {
            return Err(Error::Exists {
                what: "user",
                name: request.name,
            });
        }
        let user = self.store.create_user(&request.name, request.admin).await?;
        let grant = TokenGrant {
            name: "initial".into(),
            ..TokenGrant::default()
        };
        let issued = self.store.issue_user_token(&user.id, &grant).await?;
        tracing::info!(user = %user.name, admin = user.is_admin, "user created");
        Ok(pb::CreateUserResponse {
            user: Some(user_to_proto(user)),
            token: issued.token,
        })
    }

    /// Disables a user: their tokens fail from now on and nothing of theirs runs: every job
    /// of theirs that is queued, running or preempted stops, those their sweeps, services and
    /// batches made too, and those controllers pause on their next pass (their next job insert
    /// is refused by the same check, [`Store::check_owner`]).
    async fn disable_user(&self, caller: &Caller, name: &str) -> Result<pb::User> {
        let user = self.user_named(name).await?;
        if user.id == caller.user_id() {
            return Err(Error::InvalidArgument(
                "you cannot disable yourself; another admin can".into(),
            ));
        }
        self.store.disable_user(&user.id).await?;
        let reason = format!("owner {} was disabled", user.name);
        let stopped = stop_owner_jobs(&self.nats, &self.store, &user.id, None, &reason).await?;
        tracing::info!(user = %user.name, stopped, "user disabled");
        let disabled = self.store.user_by_id(&user.id).await?.unwrap_or(user);
        Ok(user_to_proto(disabled))
    }

    async fn create_token(&self, caller: &Caller, request: pb::CreateTokenRequest) -> Result<pb::CreateTokenResponse> {
        let name = if request.name.is_empty() {
            format!("token-{}", now_ms())
        } else {
            request.name
        };
        validate_name("token name", &name)?;
        if self.store.find_token(Some(caller.user_id()), &name).await?.is_some() {
            return Err(Error::Exists { what: "token", name });
        }
        if request.expires_in_secs > MAX_EXPIRY_SECS {
            return Err(Error::InvalidArgument(format!(
                "expires_in_secs {} is more than ten years ({MAX_EXPIRY_SECS})",
                request.expires_in_secs
            )));
        }
        let role = Role::from_proto(request.role);
        let narrowed_to = match (request.project.is_empty(), role) {
            (true, None) => None,
            (false, Some(role)) => {
                // The token may carry at most the caller's own role there.
                caller.authorize_with(Need::Role(role), &Resource::project(&request.project))?;
                access::project(&self.store, caller, &request.project).await?;
                Some((request.project, role))
            }
            _ => {
                return Err(Error::InvalidArgument(
                    "give both project and role to narrow a token, or neither".into(),
                ));
            }
        };
        let expires_at_ms = (request.expires_in_secs > 0).then(|| now_ms() + (request.expires_in_secs as i64) * 1000);
        let grant = TokenGrant {
            name,
            expires_at_ms,
            narrowed_to,
        };
        let issued = self.store.issue_user_token(caller.user_id(), &grant).await?;
        let token = self
            .store
            .find_token(None, &issued.id)
            .await?
            .expect("token just issued");
        tracing::info!(user = %caller.principal.user_name, token = %token.name, "token created");
        Ok(pb::CreateTokenResponse {
            token: Some(token_to_proto(token, &caller.principal.user_name)),
            secret: issued.token,
        })
    }

    /// Revokes one of the caller's tokens by name or id; the admin may revoke anyone's by id.
    async fn revoke_token(&self, caller: &Caller, name_or_id: &str) -> Result<pb::Token> {
        if name_or_id.is_empty() || name_or_id.len() > 64 {
            return Err(Error::InvalidArgument(
                "token must name one of your tokens, or its id".into(),
            ));
        }
        let own = self.store.find_token(Some(caller.user_id()), name_or_id).await?;
        let token = match own {
            Some(token) => token,
            None if caller.is_admin() => {
                self.store
                    .find_token(None, name_or_id)
                    .await?
                    .ok_or_else(|| Error::TokenNotFound {
                        token: name_or_id.to_string(),
                    })?
            }
            None => {
                return Err(Error::TokenNotFound {
                    token: name_or_id.to_string(),
                });
            }
        };
        self.store.revoke_token(&token.id).await?;
        let owner = self.store.user_by_id(&token.user_id).await?.map(|user| user.name);
        tracing::info!(token = %token.name, by = %caller.principal.user_name, "token revoked");
        let revoked = api_token::Model { revoked: true, ..token };
        Ok(token_to_proto(revoked, owner.as_deref().unwrap_or_default()))
    }
}

#[tonic::async_trait]
impl UserService for UsersApi {
    #[tracing::instrument(skip_all, fields(user = %request.get_ref().name))]
    async fn create_user(
        &self,
        request: Request<pb::CreateUserRequest>,
    ) -> Result<Response<pb::CreateUserResponse>, Status> {
        Ok(Response::new(self.create_user(request.into_inner()).await?))
    }

    #[tracing::instrument(skip_all)]
    async fn list_users(
        &self,
        _request: Request<pb::ListUsersRequest>,
    ) -> Result<Response<pb::ListUsersResponse>, Status> {
        let users = self.store.list_users().await.map_err(Error::from)?;
        Ok(Response::new(pb::ListUsersResponse {
            users: users.into_iter().map(user_to_proto).collect(),
        }))
    }

    #[tracing::instrument(skip_all, fields(user = %request.get_ref().name))]
    async fn disable_user(&self, request: Request<pb::UserRef>) -> Result<Response<pb::User>, Status> {
        let caller = access::caller(&request)?;
        Ok(Response::new(
            self.disable_user(&caller, &request.get_ref().name).await?,
        ))
    }

    #[tracing::instrument(skip_all)]
    async fn create_token(
        &self,
        request: Request<pb::CreateTokenRequest>,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        let caller = access::caller(&request)?;
        Ok(Response::new(self.create_token(&caller, request.into_inner()).await?))
    }

    #[tracing::instrument(skip_all)]
    async fn list_tokens(
        &self,
        request: Request<pb::ListTokensRequest>,
    ) -> Result<Response<pb::ListTokensResponse>, Status> {
        let caller = access::caller(&request)?;
        let tokens = self
            .store
            .list_tokens(caller.user_id(), request.get_ref().all)
            .await
            .map_err(Error::from)?;
        let name = &caller.principal.user_name;
        Ok(Response::new(pb::ListTokensResponse {
            tokens: tokens.into_iter().map(|token| token_to_proto(token, name)).collect(),
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn revoke_token(&self, request: Request<pb::RevokeTokenRequest>) -> Result<Response<pb::Token>, Status> {
        let caller = access::caller(&request)?;
        Ok(Response::new(
            self.revoke_token(&caller, &request.get_ref().token).await?,
        ))
    }

    #[tracing::instrument(skip_all)]
    async fn approve_login(
        &self,
        request: Request<pb::ApproveLoginRequest>,
    ) -> Result<Response<pb::ApprovedLogin>, Status> {
        let caller = access::caller(&request)?;
        let approved = self
            .store
            .approve_login(&caller.principal, &request.get_ref().code)
            .await
            .map_err(Error::from)?;
        tracing::info!(user = %caller.principal.user_name, "web UI login approved");
        Ok(Response::new(pb::ApprovedLogin {
            user_agent: approved.user_agent,
            requested_at_ms: approved.requested_at_ms,
            expires_at_ms: approved.expires_at_ms,
        }))
    }
}
