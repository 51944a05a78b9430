import 'uplot/dist/uPlot.min.css';
import './app.css';
import { mount } from 'svelte';
import App from './App.svelte';
import { setUnauthenticatedHandler } from './lib/api';
import { navigate, router, startRouter } from './lib/router.svelte';
import { session } from './lib/session.svelte';
import { startTheme } from './lib/theme.svelte';

startTheme();
startRouter();
// Any 401 means the session is gone: back to the login page (once, however many calls fail).
setUnauthenticatedHandler(() => {
  session.me = undefined;
  if (router.route.page !== 'login') navigate('/login');
});

mount(App, { target: document.getElementById('app')! });
