// Who is signed in (NodeService/WhoAmI), and their user id, which WhoAmI does not give but jobs
// carry as `owner`: the owner of any job ListJobs returns without `everyone` is the caller.

import { rpc, whoAmI } from './api';
import type { Job, WhoAmI } from './types';

export const session = $state<{ me: WhoAmI | undefined; myUserId: string | undefined; loaded: boolean }>({
  me: undefined,
  myUserId: undefined,
  loaded: false,
});

export async function loadSession(): Promise<void> {
  try {
    session.me = await whoAmI();
  } catch {
    session.me = undefined;
  }
  session.loaded = true;
  if (session.me) void loadMyUserId();
}

async function loadMyUserId(): Promise<void> {
  try {
    const { jobs } = await rpc<{ jobs: Job[] }>('JobService', 'ListJobs', { all: true, limit: 1 });
    session.myUserId = jobs[0]?.owner;
  } catch {
    session.myUserId = undefined;
  }
}

export function setSession(me: WhoAmI | undefined): void {
  session.me = me;
  session.loaded = true;
  session.myUserId = undefined;
  if (me) void loadMyUserId();
}
